"""Weights from the trainer into running ``vllm serve`` processes over NCCL: vLLM's weight-transfer endpoints, the
trainer as rank 0 of a group with each server's workers."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from tunekit.placement.ports import free_port
from tunekit.trainer.rollout.engine_io import tensor_bytes
from tunekit.trainer.rollout.server_process import http_json, local_address_towards


def send_to_all(pushes: list[NcclWeightPush], buckets) -> int:
    """Pause every server, stream the buckets into each (a bucket is gathered once and sent to each server in
    turn), resume them; returns the bytes of the weights (what one server received)."""
    moved, paused = 0, []
    try:
        for p in pushes:
            paused.append(p)
            p.begin()  # pausing also drops the prefix cache, which the old weights computed
        for bucket in buckets:
            for p in pushes:
                p.send_bucket(bucket)
            moved += sum(tensor_bytes(t) for _, t in bucket)
        for p in pushes:
            p.post("/finish_weight_update")
    finally:
        for p in paused:
            p.post("/resume")
    return moved


class NcclWeightPush:
    """The trainer's side of vLLM's NCCL weight transfer: rank 0 of a group with the server's workers."""

    def __init__(self, url: str, *, workers: int, device: torch.device, timeout_s: float) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        self.url, self.device, self.timeout_s = url, device, timeout_s
        init = {"master_address": local_address_towards(url), "master_port": free_port(), "rank_offset": 1,
                "world_size": workers + 1}
        box: dict[str, object] = {}

        def join() -> None:  # blocks until every worker joined: run beside the HTTP call that makes them join
            try:
                torch.cuda.set_device(device)  # vLLM's trainer side uses the current device
                box["comm"] = NCCLWeightTransferEngine.trainer_init(init)
            except Exception as e:  # noqa: BLE001 - reported below
                box["error"] = e

        thread = threading.Thread(target=join, daemon=True, name="nccl-weight-push-init")
        thread.start()
        http_json("POST", f"{url}/init_weight_transfer_engine", {"init_info": init}, timeout=timeout_s)
        thread.join(timeout_s)
        if "comm" not in box:
            raise RuntimeError(f"trainer side of the NCCL group did not form: {box.get('error', 'timed out')}")
        self.comm = box["comm"]
        self.http = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-weight-update")

    def post(self, path: str, body: dict | None = None):
        return http_json("POST", f"{self.url}{path}", body, timeout=self.timeout_s)

    def begin(self) -> None:
        """Pause the server and open a weight update."""
        self.post("/pause")
        self.post("/start_weight_update")

    def send_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Stream one bucket into the server."""
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        bucket = [(n, t.to(self.device)) for n, t in bucket]  # offloaded params are on CPU
        meta = {"names": [n for n, _ in bucket],
                "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket], "packed": True}
        answer = self.http.submit(self.post, "/update_weights", {"update_info": meta})
        torch.cuda.current_stream().synchronize()  # the sender packs on its own streams: gathers must be done
        NCCLWeightTransferEngine.trainer_send_weights(iter(bucket), {"group": self.comm, "packed": True})
        torch.cuda.synchronize()
        answer.result(timeout=self.timeout_s)
