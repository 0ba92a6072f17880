"""vLLM rollout backends: what runs without a GPU (requests, responses, weight buckets, the server
process manager, a fake server, preflight) and, marked ``gpu``, short probes on the H200."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.config.errors import ConfigError
from tunekit.launch.preflight import preflight
from tunekit.launch.procs import kill_leftover_servers
from tunekit.trainer.rollout.engine_io import (
    bucket_weights,
    build_requests,
    pad_responses,
    prompt_token_lists,
    row_seeds,
    sampled_logprobs,
)
from tunekit.placement.ports import free_port
from tunekit.placement.backends import trainer_devices, trainer_world_size
from tunekit.trainer.rollout.server_process import ServerError, ServerProcess, health_problem, start_together
from tunekit.trainer.rollout.vllm_server import (
    VLLMServerRollout,
    completion_body,
    parse_completion,
    server_command,
    server_env,
)
from conftest import vllm_gpu_skip

PAD, EOS = 0, 2


def _prompts() -> dict[str, torch.Tensor]:
    return {"prompt_ids": torch.tensor([[PAD, PAD, 5, 6], [7, 8, 9, 10], [PAD, 11, 12, 13]]),
            "prompt_mask": torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])}


# ---------------------------------------------------------------- requests and responses


def test_prompt_token_lists_strip_left_padding():
    p = _prompts()
    assert prompt_token_lists(p["prompt_ids"], p["prompt_mask"]) == [[5, 6], [7, 8, 9, 10], [11, 12, 13]]


def test_build_requests_one_seed_per_row_and_fixed_length_masks_eos():
    rows, params = build_requests(_prompts(), seed=7, temperature=0.7, max_new_tokens=16, fixed_length=True, eos_id=EOS)
    assert rows[0] == [5, 6]
    assert len({p["seed"] for p in params}) == 3  # a GRPO group's repeated prompts must not sample alike
    assert [p["seed"] for p in params] == row_seeds(7, 3)  # same call seed, same samples
    assert row_seeds(8, 3) != row_seeds(7, 3)
    p = params[0]
    assert (p["temperature"], p["max_tokens"], p["min_tokens"], p["stop_token_ids"], p["logprobs"]) == (0.7, 16, 16, [EOS], 0)
    assert (p["top_k"], p["top_p"], p["min_p"], p["repetition_penalty"]) == (0, 1.0, 0.0, 1.0)  # pure temperature sampling
    _, natural = build_requests(_prompts(), seed=7, temperature=1.0, max_new_tokens=16, fixed_length=False, eos_id=EOS)
    assert natural[0]["min_tokens"] == 0
    _, bare = build_requests(_prompts(), seed=7, temperature=0.7, max_new_tokens=16, fixed_length=True, eos_id=EOS,
                             logprobs=False)
    assert all(p["logprobs"] is None for p in bare)  # vLLM's "no logprobs", not 0 (the sampled token's)
    assert [p["seed"] for p in bare] == [p["seed"] for p in params]  # the same samples either way


def test_engine_empties_the_training_cache_only_when_it_would_not_fit():
    from tunekit.trainer.rollout.vllm_engine import WAKE_HEADROOM_BYTES, must_empty_cache

    gib = 1024**3
    assert not must_empty_cache(free_bytes=80 * gib, wake_bytes=50 * gib)  # training's cache stays warm
    assert must_empty_cache(free_bytes=50 * gib, wake_bytes=50 * gib)  # no headroom left
    assert must_empty_cache(free_bytes=10 * gib, wake_bytes=50 * gib)
    assert not must_empty_cache(free_bytes=WAKE_HEADROOM_BYTES, wake_bytes=0)


@pytest.mark.parametrize("value", ["3", "deep"])
def test_bad_sleep_level_names_the_key(value):
    with pytest.raises(ConfigError, match="system.rollout.sleep_level"):
        load_recipe(None, [f"system.rollout.sleep_level={value}"])


def test_pad_responses_keeps_eos_and_right_pads():
    ids, logp = pad_responses([[4, EOS], [4, 5, 6, 7], []], [[-0.5, -0.25], [-1.0] * 4, []], length=4, pad_id=PAD)
    assert ids.tolist() == [[4, EOS, PAD, PAD], [4, 5, 6, 7], [PAD] * 4]
    assert logp.tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0] * 4, [0.0] * 4]
    assert ids.dtype == torch.long and logp.dtype == torch.float32
    with pytest.raises(ValueError, match="row 0"):
        pad_responses([[4, 5]], [[-1.0]], length=4, pad_id=PAD)
    bare_ids, none = pad_responses([[4, EOS], [4, 5, 6, 7], []], None, length=4, pad_id=PAD)
    assert none is None and bare_ids.tolist() == ids.tolist()


def test_sampled_logprobs_reads_the_sampled_token():
    lp = lambda v: SimpleNamespace(logprob=v)  # noqa: E731 - vLLM's Logprob has .logprob
    positions = [{4: lp(-0.5)}, {9: lp(-2.0), 5: lp(-0.1)}]
    assert sampled_logprobs([4, 5], positions) == [-0.5, -0.1]
    with pytest.raises(ValueError):
        sampled_logprobs([4], positions)


def test_parse_completion_token_ids_and_token_id_strings():
    resp = {"choices": [{"token_ids": [4, 2], "logprobs": {"token_logprobs": [-0.5, -1.5], "tokens": ["a", "b"]}}]}
    assert parse_completion(resp) == ([4, 2], [-0.5, -1.5])
    old = {"choices": [{"logprobs": {"token_logprobs": [-0.5], "tokens": ["token_id:17"]}}]}
    assert parse_completion(old) == ([17], [-0.5])
    with pytest.raises(ServerError, match="logprobs"):
        parse_completion({"choices": [{"token_ids": [4, 2], "logprobs": None}]})
    assert parse_completion({"choices": [{"token_ids": [4, 2], "logprobs": None}]}, logprobs=False) == ([4, 2], None)
    with pytest.raises(ServerError, match="system.rollout.logprobs"):  # ids only came inside the logprobs
        parse_completion(old, logprobs=False)


def test_completion_body_asks_for_token_ids():
    body = completion_body([5, 6], {"seed": 3, "logprobs": 0}, "m")
    assert body["prompt"] == [5, 6] and body["return_token_ids"] and body["seed"] == 3 and body["model"] == "m"


# ---------------------------------------------------------------- weight buckets


def test_bucket_weights_groups_casts_and_streams():
    consumed = []

    def params():
        for i, n in enumerate([100, 100, 100, 1000, 10]):  # float32: 4 bytes per element
            consumed.append(i)
            yield f"p{i}", torch.ones(n)

    it = bucket_weights(params(), bucket_bytes=500, dtype=torch.bfloat16)  # bf16: 200 B, 200 B, 200 B, 2000 B, 20 B
    first = next(it)
    assert [n for n, _ in first] == ["p0", "p1"]
    assert consumed == [0, 1, 2]  # lazily: only one tensor past the bucket was gathered
    rest = list(it)
    assert [[n for n, _ in b] for b in rest] == [["p2"], ["p3"], ["p4"]]  # a tensor above the limit goes alone
    assert all(t.dtype == torch.bfloat16 for b in [first, *rest] for _, t in b)
    ints = list(bucket_weights([("i", torch.arange(3))], bucket_bytes=500, dtype=torch.bfloat16))
    assert ints[0][0][1].dtype == torch.int64  # only floating tensors change dtype


# ---------------------------------------------------------------- the checkpoint an engine loads


class _Tok:
    def save_pretrained(self, out):
        (Path(out) / "tokenizer_config.json").write_text("{}")


def test_export_checkpoint_saves_a_preset_in_bf16_and_reuses_complete_dirs(tmp_path):
    from safetensors.torch import load_file

    from tunekit.workload.models import build_causal_lm
    from tunekit.trainer.rollout.checkpoint import export_checkpoint, max_model_len

    model = build_causal_lm(path=None, preset="tiny-arith", vocab_size=19, dtype=torch.float32, seed=3)
    out = export_checkpoint(model, _Tok(), path=None, out_dir=tmp_path / "preset")
    saved = load_file(str(out / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in saved.values())
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(saved[name], model.state_dict()[name].to(torch.bfloat16))  # the actor's own initial weights
    assert (out / "tokenizer_config.json").exists() and max_model_len(out, 4) == 128  # capped by the positions
    assert export_checkpoint(None, _Tok(), path=str(out), out_dir=tmp_path / "unused") == out
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    linked = export_checkpoint(None, _Tok(), path=str(bare), out_dir=tmp_path / "linked")
    assert (linked / "config.json").is_symlink() and (linked / "tokenizer_config.json").exists()
    assert max_model_len(linked, 128) == 640


def test_rollout_checkpoint_uses_the_embedded_checkpoint_as_it_is():
    from tunekit.workload.models import EMBEDDED_MODEL_DIR
    from tunekit.placement.dist import Dist
    from tunekit.trainer.rollout.checkpoint import rollout_checkpoint

    if not (EMBEDDED_MODEL_DIR / "tokenizer_config.json").exists():
        pytest.skip("the embedded checkpoint is not built (scripts/make_tiny_assets.py)")
    assert rollout_checkpoint(load_recipe(None), None, _Tok(), Dist()) == EMBEDDED_MODEL_DIR


# ---------------------------------------------------------------- server command and process manager


def test_decode_graphs_are_captured_up_to_the_most_sequences_an_engine_decodes():
    from tunekit.trainer.rollout.engine_io import compilation_config, most_sequences

    grpo = load_recipe(None, ["system.batch.prompts_per_step=8", "system.batch.samples_per_prompt=4"])
    assert most_sequences(grpo) == 32
    assert most_sequences(load_recipe(None, ["system.batch.prompts_per_step=8", "system.batch.samples_per_prompt=4",
                                             "system.rollout.max_num_seqs=16"])) == 16
    assert compilation_config(True, False, 32) is None  # eager: nothing captured
    assert compilation_config(False, True, 32) == {"max_cudagraph_capture_size": 32}  # vLLM's compile, bounded


def test_server_command_and_env():
    r = load_recipe(None, ["system.rollout.backend=vllm_server", "system.rollout.gpu_memory_utilization=0.4",
                           "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[1,2]}",
                           "system.rollout.tensor_parallel_size=2"])
    cmd = server_command(Path("/ckpt"), port=8123, recipe=r, max_len=640, sleep=False)
    s = " ".join(cmd)
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", "/ckpt"]
    for flag in ("--port 8123", "--tensor-parallel-size 2", "--gpu-memory-utilization 0.4", "--max-model-len 640",
                 "--logprobs-mode processed_logprobs", "--generation-config vllm", "--enforce-eager",
                 "--skip-tokenizer-init"):
        assert flag in s
    assert cmd[cmd.index("--weight-transfer-config") + 1] == '{"backend":"nccl"}'
    assert "--enable-sleep-mode" not in cmd
    assert "--enable-sleep-mode" in server_command(Path("/ckpt"), port=1, recipe=r, max_len=64, sleep=True)
    assert "--compilation-config" not in cmd  # eager: nothing to capture
    graphs = server_command(Path("/ckpt"), port=1, recipe=r.model_copy(update={"system": r.system.model_copy(
        update={"rollout": r.system.rollout.model_copy(update={"enforce_eager": False})})}), max_len=64, sleep=False)
    assert "--enforce-eager" not in graphs
    # decode graphs captured for batches up to the step's 32 samples only (the default recipe: 32 prompts x 1)
    assert json.loads(graphs[graphs.index("--compilation-config") + 1]) == {
        "mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "max_cudagraph_capture_size": 32}
    # the trainer sees only its GPU (4); the launcher saw 4,5,6, so device-map indices 1,2 are GPUs 5,6
    env = server_env([1, 2], {"RANK": "0", "MASTER_PORT": "1", "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "4",
                              "TUNEKIT_LAUNCH_GPUS": "4,5,6"})
    assert env["CUDA_VISIBLE_DEVICES"] == "5,6" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "RANK" not in env and "MASTER_PORT" not in env and env["PATH"] == "/bin"


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_server_that_never_answers_times_out_with_its_log_and_leaves_nothing(tmp_path):
    cmd = [sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(60)"]
    server = ServerProcess(cmd, url=f"http://127.0.0.1:{free_port()}", log_path=tmp_path / "vllm_server.log")
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"did not answer .*/health within 1\.5 s .*loading weights"):
        server.start(timeout_s=1.5, poll_s=0.1)
    assert time.monotonic() - t0 < 15
    assert _gone(server.proc.pid) and not server.pgid_path.exists()


def test_server_that_exits_fails_fast_with_its_last_lines(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('ValueError: bad --max-model-len'); sys.exit(3)"]
    server = ServerProcess(cmd, url=f"http://127.0.0.1:{free_port()}", log_path=tmp_path / "vllm_server.log")
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="exited with code 3 before answering.*bad --max-model-len"):
        server.start(timeout_s=60, poll_s=0.1)
    assert time.monotonic() - t0 < 10


_HEALTH_SERVER = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    print('server up', flush=True)
    HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
""")


def test_server_dying_mid_probe_is_reported_with_its_log(tmp_path):
    port = free_port()
    server = ServerProcess([sys.executable, "-c", _HEALTH_SERVER, str(port)], url=f"http://127.0.0.1:{port}",
                           log_path=tmp_path / "vllm_server.log")
    server.start(timeout_s=30, poll_s=0.1)
    server.check()  # alive: no error
    assert server.pgid_path.read_text() == str(server.proc.pid)
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    with pytest.raises(ServerError, match="exited with code -9 mid-probe.*server up"):
        server.check()
    server.stop()
    assert not server.pgid_path.exists()


def test_servers_started_together_outlive_the_threads_that_waited_for_them(tmp_path):
    # a server's parent-death signal fires when the thread that started it exits: started inside the pool that
    # waits for /health, each server was stopped as soon as the pool closed, and the first request was refused
    servers = []
    for i in range(2):
        port = free_port()
        servers.append(ServerProcess([sys.executable, "-c", _HEALTH_SERVER, str(port)], url=f"http://127.0.0.1:{port}",
                                     log_path=tmp_path / f"vllm_server{i}.log"))
    start_together(servers, timeout_s=30)
    try:
        time.sleep(1.0)
        for server in servers:
            server.check()  # still alive
            assert health_problem(server.url) is None
    finally:
        for server in servers:
            server.stop()


def test_launcher_kills_a_server_its_trainer_left_behind(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (tmp_path / "vllm_server.pgid").write_text(str(proc.pid))
    kill_leftover_servers(tmp_path)
    assert proc.wait(10) == -signal.SIGKILL
    assert not (tmp_path / "vllm_server.pgid").exists()


# ---------------------------------------------------------------- a fake server: generation and staleness on CPU


class _FakeVLLM(BaseHTTPRequestHandler):
    """/health, /v1/models and /v1/completions like vLLM 0.25, without the RLHF dev endpoints."""

    requests: list[dict] = []
    fail = False
    metric_reads = 0

    def _send(self, code: int, body: dict | None = None) -> None:
        raw = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802
        if self.path == "/health":
            return self._send(200)
        if self.path == "/v1/models":
            return self._send(200, {"data": [{"id": "fake-model"}]})
        if self.path == "/metrics":  # the page's shape as vLLM serves it; usage rises by 0.25 a read
            type(self).metric_reads += 1
            raw = ("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                   "# TYPE vllm:kv_cache_usage_perc gauge\n"
                   f'vllm:kv_cache_usage_perc{{engine="0",model_name="fake-model"}} {min(1.0, 0.25 * type(self).metric_reads)}\n'
                   "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
                   "# TYPE vllm:num_preemptions_total counter\n"
                   f'vllm:num_preemptions_total{{engine="0",model_name="fake-model"}} {3.0 * type(self).metric_reads}\n').encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return None
        return self._send(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if self.path != "/v1/completions":
            return self._send(404, {"detail": "Not Found"})
        if type(self).fail:
            return self._send(500, {"error": "engine dead"})
        n = 3 if body["min_tokens"] == 0 else body["max_tokens"]  # natural length: stop at EOS after 2 tokens
        ids = [4 + (body["seed"] % 5)] * (n - 1) + [EOS] if n < body["max_tokens"] else [4] * n
        self._send(200, {"choices": [{"index": 0, "text": "", "token_ids": ids,
                                      "logprobs": {"token_logprobs": [-0.5] * len(ids), "tokens": [""] * len(ids)}}]})

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    _FakeVLLM.requests, _FakeVLLM.fail, _FakeVLLM.metric_reads = [], False, 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVLLM)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _server_rollout(url: str, fixed_length: bool = False) -> VLLMServerRollout:
    r = load_recipe(None, ["system.rollout.backend=vllm_server", f"system.rollout.server_url={url}"])
    return VLLMServerRollout(recipe=r, device=torch.device("cpu"), tokenizer=None, pad_id=PAD, eos_id=EOS,
                             max_new_tokens=6, temperature=1.0, fixed_length=fixed_length)


def test_server_rollout_generates_and_records_staleness_when_weights_cannot_be_pushed(fake_server):
    rollout = _server_rollout(fake_server)
    assert "no CUDA" in rollout.push_problem and not rollout.push
    ids, logp = rollout.generate(_prompts(), seed=11)
    assert ids.shape == (3, 6) and ids[:, 2].tolist() == [EOS] * 3 and ids[:, 3:].eq(PAD).all()
    assert logp[:, :3].eq(-0.5).all() and logp[:, 3:].eq(0).all()
    sent = sorted(_FakeVLLM.requests, key=lambda b: b["prompt"])
    assert [b["prompt"] for b in sent] == [[5, 6], [7, 8, 9, 10], [11, 12, 13]]
    assert sent[0]["model"] == "fake-model" and sent[0]["logprobs"] == 0 and sent[0]["return_token_ids"]
    assert rollout.last_metrics["rollout/staleness_steps"] == 0
    # the server's /metrics page read before and after the generation (and between, while it runs)
    reads = _FakeVLLM.metric_reads
    assert reads >= 2 and rollout.last_metrics["rollout/preemptions"] == 3.0 * (reads - 1)
    assert rollout.last_metrics["rollout/kv_usage_peak"] == min(1.0, 0.25 * reads)
    for step in (1, 2):
        drained = []
        assert rollout.sync_weights((drained.append(i) or (f"w{i}", torch.ones(2)) for i in range(4))) == 0
        assert drained == [0, 1, 2, 3]  # every FSDP rank must still run the gather
        rollout.generate(_prompts(), seed=11 + step)
        assert rollout.last_metrics["rollout/staleness_steps"] == step
    rollout.close()


def test_server_rollout_fixed_length_and_server_errors(fake_server):
    rollout = _server_rollout(fake_server, fixed_length=True)
    ids, _ = rollout.generate(_prompts(), seed=1)
    assert ids.eq(4).all() and _FakeVLLM.requests[-1]["min_tokens"] == 6
    _FakeVLLM.fail = True
    with pytest.raises(ServerError, match="failed a generation request .*HTTP 500"):
        rollout.generate(_prompts(), seed=2)
    rollout.close()


def test_server_rollout_unreachable_url_is_one_sentence():
    with pytest.raises(ServerError, match=r"server_url http://127\.0\.0\.1:1 does not answer"):
        _server_rollout("http://127.0.0.1:1")


# ---------------------------------------------------------------- config and preflight


def test_trainer_devices_leave_out_a_server_rollout_group():
    r = load_recipe(None, ["system.rollout.backend=vllm_server", "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[1]}"])
    assert trainer_devices(r.system) == [0] and trainer_world_size(r.system) == 1
    assert r.system.world_size == 2  # the server's GPU is paid for
    hf = load_recipe(None, ["system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[0,1]}"])
    assert trainer_devices(hf.system) == [0, 1]


def test_preflight_accepts_a_split_server_in_spmd_and_wants_a_url_without_gpus(fake_server):
    split = load_recipe(None, ["system.rollout.backend=vllm_server", "system.device=cpu", f"system.rollout.server_url={fake_server}",
                               "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[1]}"])
    preflight(split, cuda_count=0)  # answers, needs no local vLLM or GPU
    nowhere = load_recipe(None, ["system.rollout.backend=vllm_server",
                                 "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[]}"])
    with pytest.raises(ConfigError, match=r"rollout is \[\].*server_url is not set"):
        preflight(nowhere, cuda_count=1)


@pytest.mark.parametrize("overrides, needle", [
    (["system.rollout.backend=vllm_server", "system.rollout.server_url=http://127.0.0.1:1"],
     "system.rollout.server_url http://127.0.0.1:1 does not answer"),
    (["system.rollout.backend=vllm_server", "system.rollout.server_url=127.0.0.1:8000"], "must be an http:// or https:// URL"),
    (["system.rollout.gpu_memory_utilization=1.5"], "gpu_memory_utilization"),
    (["system.rollout.gpu_memory_utilization=0"], "must be in (0, 1]"),
])
def test_bad_rollout_input_exits_2_before_any_run_dir(tmp_path, overrides, needle):
    args = ["probe", "--out", str(tmp_path / "runs"), "--steps", "2"]
    for o in overrides:
        args += ["--set", o]
    t0 = time.monotonic()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.output.split())
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert time.monotonic() - t0 < 20  # a dead URL fails fast, no hang


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_backend_without_vllm_says_how_to_install(tmp_path):
    result = CliRunner().invoke(app, ["probe", "--out", str(tmp_path), "--set", "system.rollout.backend=vllm"])
    assert result.exit_code == 2
    assert 'pip install -e ".[vllm]"' in " ".join(result.output.split())


# ---------------------------------------------------------------- a whole probe against the fake server (CPU)


def _embedded_model() -> bool:
    from tunekit.workload.models import EMBEDDED_MODEL_DIR

    return (EMBEDDED_MODEL_DIR / "config.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _embedded_model(), reason="the embedded checkpoint is not built (scripts/make_tiny_assets.py)")
def test_cpu_probe_against_a_server_records_staleness(tmp_path, fake_server):
    from tunekit.launch.probe import run_probe
    from tunekit.rundir import read_steps

    r = load_recipe(None, ["system.rollout.backend=vllm_server", f"system.rollout.server_url={fake_server}",
                           "system.device=cpu", "probe.steps=3", "probe.warmup_steps=1", "profiler.comm_steps=0",
                           "system.batch.prompts_per_step=8", "system.batch.micro_batch_size=4"])
    result = run_probe(r, out=tmp_path)
    assert result.status == "ok", result.summary["reason"]
    steps = read_steps(result.run_dir)
    assert steps["rollout/staleness_steps"].tolist() == [0, 1, 2]
    assert (steps["rollout/tokens_per_s"] > 0).all()


# ---------------------------------------------------------------- GPU (the H200 machine)


def _gpu_probe(tmp_path, overrides: list[str], min_gpus: int = 1):
    reason = vllm_gpu_skip(min_gpus)
    if reason:
        pytest.skip(reason)
    from tunekit.launch.probe import run_probe
    from tunekit.rundir import read_steps

    base = ["probe.steps=3", "probe.warmup_steps=1", "profiler.comm_steps=0", "system.batch.prompts_per_step=32",
            "system.compile=false",  # these are about the rollout: the 0.5B preset compiles for minutes on a GPU
            "system.rollout.gpu_memory_utilization=0.3"]
    result = run_probe(load_recipe(None, base + overrides), out=tmp_path)
    assert result.status == "ok", result.summary["reason"]
    return read_steps(result.run_dir)


@pytest.mark.gpu
@pytest.mark.parametrize("sleep", ["false", "level1"])
def test_gpu_vllm_probe_is_on_policy_and_records_the_kv_cache_signal(tmp_path, sleep):
    """Whether the engine stays awake between rollouts or sleeps keeping its weights (level 1): the synced weights
    reach it every step, its samples stay on-policy and every step's record (the warm-up's included) holds the
    KV-cache signal. The default, level 2 (the engine drops its weights while asleep, so only the synced weights are
    in it after a wake), is the offloaded vLLM probe's in tests/test_offload.py, held to the same on-policy bound."""
    knobs = ["system.rollout.enable_sleep=true", "system.rollout.sleep_level=1"] if sleep == "level1" else \
        ["system.rollout.enable_sleep=false"]
    steps = _gpu_probe(tmp_path, ["system.rollout.backend=vllm", *knobs])
    assert (steps["rollout/weight_sync_bytes"] > 0).all()
    assert (steps["timing_s/update_weights"] > 0).all()
    # bf16 engine vs the actor's bf16 compute over fp32 masters: small, and it stays small after updates
    assert steps["rollout/logprob_abs_diff_mean"].max() < 0.1
    # a missing column is a KeyError here
    assert steps["rollout/kv_usage_peak"].notna().all() and steps["rollout/preemptions"].notna().all()
    assert (steps["rollout/kv_usage_peak"] > 0).all() and (steps["rollout/kv_usage_peak"] <= 1).all()
    assert (steps["rollout/preemptions"] == 0).all()  # 32 short rows in a pool of 0.3 x 141 GiB


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_vllm_server_on_the_trainer_gpu_is_stale(tmp_path):
    steps = _gpu_probe(tmp_path, ["system.rollout.backend=vllm_server"])
    assert steps["rollout/staleness_steps"].tolist() == [0, 1, 2]  # NCCL cannot push on one GPU


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_vllm_server_on_its_own_gpu_gets_weights(tmp_path):
    steps = _gpu_probe(tmp_path, ["system.rollout.backend=vllm_server",
                                  "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[1]}"], min_gpus=2)
    assert steps["rollout/staleness_steps"].tolist() == [0, 0, 0]
    assert (steps["rollout/weight_sync_bytes"] > 0).all()
    assert steps["rollout/logprob_abs_diff_mean"].max() < 0.1


@pytest.mark.gpu
def test_vllm_engine_samples_by_seed_and_counts_the_kv_blocks_in_use():
    """An engine whose cache has a known number of blocks: the same call seed and batch give the same samples, and
    rows of a GRPO group differ; a batch that fits reports the share of blocks its rows hold, one that does not fill
    the cache and is preempted."""
    reason = vllm_gpu_skip()
    if reason:
        pytest.skip(reason)
    import math

    from tunekit.placement.dist import Dist
    from tunekit.trainer.batch import encode_prompts
    from tunekit.trainer.build import load_tokenizer, rollout_engine_dir, rollout_kwargs
    from tunekit.trainer.rollout.engine_io import engine_stats
    from tunekit.trainer.rollout.vllm_engine import VLLMRollout

    new = 64
    recipe = load_recipe(None, ["system.rollout.backend=vllm", "system.rollout.gpu_memory_utilization=0.2",
                                "system.rollout.enable_sleep=false", f"task.max_new_tokens={new}",
                                "task.fixed_length=true", "system.rollout.max_num_seqs=128"])
    tok, dist, blocks = load_tokenizer(recipe), Dist(device=torch.device("cuda", 0)), 128
    rollout = VLLMRollout(recipe=recipe, device=dist.device, tokenizer=tok,
                          model_dir=rollout_engine_dir(recipe, dist, tok),
                          engine_args={"num_gpu_blocks_override": blocks}, **rollout_kwargs(recipe, tok))
    assert rollout.step_tap is not None, "this vLLM hands no per-step stats to a tap"
    block = rollout.llm.llm_engine.vllm_config.cache_config.block_size

    grouped = encode_prompts(tok, ["1+2=", "3+4="] * 4)  # repeated prompts: a GRPO group each
    first, again, other = (rollout.generate(grouped, seed=s)[0] for s in (5, 5, 6))
    assert torch.equal(first, again)  # the same call seed and batch give the same samples
    assert not torch.equal(first, other)
    assert len({tuple(r) for r in first[0::2].tolist()}) > 1  # a group's rows do not sample alike

    few = encode_prompts(tok, [f"{i}+{i + 1}=" for i in range(10, 18)])  # 8 distinct prompts
    rollout.generate(few, seed=1)
    m = dict(rollout.last_metrics)
    prompt_lens = few["prompt_mask"].sum(1).tolist()
    # each row holds its prompt and the tokens generated so far (the last one sampled is never cached)
    lo = sum(math.ceil((p + new - 1) / block) for p in prompt_lens) / blocks
    hi = sum(math.ceil((p + new) / block) for p in prompt_lens) / (blocks - 1)  # vLLM keeps one null block
    assert lo - 0.02 <= m["rollout/kv_usage_peak"] <= hi + 0.02, (m, lo, hi)
    assert m["rollout/preemptions"] == 0

    many = encode_prompts(tok, [f"{i}+{i + 1}=" for i in range(10, 74)])  # 64 rows need ~320 blocks of 128
    rollout.generate(many, seed=2)
    m = dict(rollout.last_metrics)
    assert m["rollout/kv_usage_peak"] >= 0.9 and m["rollout/preemptions"] > 0, m
    assert rollout.step_tap is not None  # still read from the steps, not the fallback poll
    # the poll's source names the gauge as engine_stats reads it (the fallback and a server's /metrics)
    usage, preempted = engine_stats(rollout.llm.get_metrics())
    assert usage is not None and preempted is not None and preempted >= m["rollout/preemptions"]


def test_a_step_whose_rollout_returns_no_logprobs_trains_and_skips_the_engine_check():
    """``system.rollout.logprobs: false``: the backend returns None for them; the step still trains, and the check of
    the engine against the actor (which reads them) is left out rather than computed from nothing."""
    from tunekit.placement.dist import Dist
    from tunekit.profiler.phases import PhaseTimer
    from tunekit.trainer import build
    from tunekit.trainer.loop import Roles, Trainer

    recipe = load_recipe(None, ["system.device=cpu", "algorithm.name=grpo", "system.batch.prompts_per_step=2",
                                "system.batch.samples_per_prompt=2", "task.max_new_tokens=4"])
    tok, task, dist = build.load_tokenizer(recipe), build.build_task(recipe), Dist()
    torch.manual_seed(0)
    actor = build.build_actor(recipe, dist, build.build_policy(recipe, tok))
    rollout = build.build_rollout(recipe, dist, tok, actor.model, shares_actor=True)

    class NoLogprobs:  # what a vLLM backend returns when it asked the engine for none
        def __getattr__(self, name):
            return getattr(rollout, name)

        def generate(self, prompts, *, seed):
            return rollout.generate(prompts, seed=seed)[0], None

    roles = Roles(actor=actor, ref=None, rollout=NoLogprobs(), reward=build.build_reward(recipe, task, tok, dist.device))
    m = Trainer(recipe, roles, tokenizer=tok, task=task, dist=dist, timer=PhaseTimer(torch.device("cpu"))).step(0)
    assert "rollout/logprob_abs_diff_mean" not in m
    assert m["actor/grad_norm"] > 0 and "timing_s/update_actor" in m


def test_an_engine_that_moves_the_compile_caches_leaves_them_where_the_probe_put_them(monkeypatch) -> None:
    """vLLM points Inductor's and Triton's caches into its own per-configuration directory while its engine
    compiles; the trainer's graphs compiled afterwards go back to the probe's shared directory, and a variable the
    probe had not set stays unset."""
    from tunekit.trainer.rollout.vllm_engine import _compile_cache_env_kept

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/runs/.compile-cache")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    with _compile_cache_env_kept():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/runs/.compile-cache/vllm/torch_compile_cache/abc/inductor_cache"
        os.environ["TRITON_CACHE_DIR"] = "/runs/.compile-cache/vllm/torch_compile_cache/abc/triton_cache"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/runs/.compile-cache"
    assert "TRITON_CACHE_DIR" not in os.environ
