"""Rollout tensor parallelism (``system.rollout.tensor_parallel_size``): the layout of replicas over the rollout
GPUs under each controller and backend, the refusals, the memory verdict, the search; marked ``gpu``, a TP-2
engine against a TP-1 one and a probe whose engine spans two trainer ranks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.config.errors import ConfigError
from tunekit.launch.preflight import check_rollout_parallel, heads_problem
from tunekit.estimate.memory import estimate_memory, model_shape, would_not_fit
from tunekit.runners import runner_for
from tunekit.runners.builtin import check_groups, check_rollout_replicas
from tunekit.runners.trl import grpo_args, server_args
from tunekit.search.learning import is_systems_key
from tunekit.search.space import check_space
from tunekit.trainer.rollout.engine_group import engine_groups, own_rows
from tunekit.trainer.rollout.vllm_server import VLLMServerRollout, row_shares, server_command
from conftest import vllm_gpu_skip

pytest.importorskip("ray", reason="the single controller's placement needs Ray (pip install -e '.[dev]' or '.[ray]')")
from tunekit.trainer.worker_group import bundle_devices, role_slots  # noqa: E402  (needs Ray)

KEY = "system.rollout.tensor_parallel_size"
FOUR = "system.device_map={actor:[0,1,2,3],ref:[0,1,2,3],critic:[0,1,2,3],reward:[0,1,2,3],rollout:[0,1,2,3]}"
SPLIT = "system.device_map={actor:[0,1],ref:[0,1],critic:[0,1],reward:[0,1],rollout:[2,3]}"


def _recipe(*sets: str, recipe: str | None = None):
    return load_recipe(recipe, list(sets))


# ---------------------------------------------------------------- the key and its layout


def test_default_is_one_engine_per_rollout_gpu():
    r = _recipe("system.rollout.backend=vllm", FOUR)
    assert r.system.rollout_replicas == [[0], [1], [2], [3]]


def test_replicas_are_consecutive_blocks_of_tp_rollout_gpus():
    r = _recipe("system.rollout.backend=vllm", FOUR, f"{KEY}=2")
    assert r.system.rollout_replicas == [[0, 1], [2, 3]]
    r = _recipe("system.rollout.backend=vllm", "system.controller=single",
                "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[5,3,4,7]}", f"{KEY}=4")
    assert r.system.rollout_replicas == [[5, 3, 4, 7]]  # the map's order, not sorted


@pytest.mark.parametrize("sets, needle", [
    ([f"{KEY}=2"], "needs a vLLM backend"),  # hf: the embedded default
    (["system.rollout.backend=vllm", f"{KEY}=2"], "more than the 1 rollout GPU"),
    (["system.rollout.backend=vllm", "system.device_map.rollout=[0,1,2]", f"{KEY}=2"], "does not divide the 3"),
    (["system.rollout.backend=vllm_server", "system.rollout.server_url=http://h:1", "system.device_map.rollout=[]",
      f"{KEY}=2"], "server_url keeps its own"),
    (["system.rollout.backend=vllm", f"{KEY}=0"], KEY),
])
def test_layouts_that_cannot_run_are_refused_naming_the_key(sets, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        _recipe(*sets)
    assert KEY in str(e.value) or "tensor_parallel_size" in str(e.value)


def test_cli_refuses_before_any_run_dir(tmp_path):
    res = CliRunner().invoke(app, ["probe", "--out", str(tmp_path), "--set", "system.rollout.backend=vllm",
                                   "--set", "system.device_map.rollout=[0,1,2]", "--set", f"{KEY}=2"])
    assert res.exit_code == 2
    assert "tensor_parallel_size 2 does not divide" in res.output
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- refusals against the machine and the model


@pytest.mark.parametrize("tp, heads, kv, ok", [
    (2, 14, 2, True),    # qwen2.5-0.5b
    (4, 14, 2, False),   # 14 heads over 4
    (4, 28, 4, True),    # qwen2.5-7b
    (8, 32, 4, True),    # fewer key/value heads than GPUs: replicated, 4 divides 8
    (4, 12, 3, False),   # 3 key/value heads neither split over 4 nor divide it
    (2, 12, 3, False),
])
def test_heads_rule(tp, heads, kv, ok):
    assert (heads_problem(tp, heads, kv) is None) == ok


def test_preflight_refuses_tp_above_the_machine_and_heads_that_do_not_split():
    r = _recipe("system.device=cuda", "system.rollout.backend=vllm", FOUR, f"{KEY}=4", "model.preset=qwen2.5-7b")
    check_rollout_parallel(r, cuda_count=4)  # 28 heads, 4 key/value heads: fine
    with pytest.raises(ConfigError, match=rf"{KEY} 4 is more than this machine's 2 GPU"):
        check_rollout_parallel(r, cuda_count=2)
    small = _recipe("system.device=cuda", "system.rollout.backend=vllm", FOUR, f"{KEY}=4", "model.preset=qwen2.5-0.5b")
    with pytest.raises(ConfigError, match=rf"{KEY} 4: its 14 attention heads do not split evenly over 4 GPUs \(qwen2.5-0.5b\)"):
        check_rollout_parallel(small, cuda_count=4)


def test_cli_refuses_heads_that_do_not_split_with_exit_2(tmp_path):
    res = CliRunner().invoke(app, ["probe", "--out", str(tmp_path), "--set", "model.preset=qwen2.5-0.5b",
                                   "--set", "system.rollout.backend=vllm", "--set", FOUR, "--set", f"{KEY}=4",
                                   "--set", "system.device=cpu"])
    assert res.exit_code == 2 and "14 attention heads" in res.output
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- spmd: the ranks that share an engine


def test_engine_groups_are_vllms_consecutive_blocks():
    assert engine_groups(4, 2) == [[0, 1], [2, 3]]
    assert engine_groups(2, 2) == [[0, 1]]
    assert engine_groups(3, 1) == [[0], [1], [2]]
    with pytest.raises(ValueError):
        engine_groups(4, 3)


def test_each_rank_keeps_its_own_rows_of_the_groups_generation():
    outs = ["a0", "a1", "b0", "b1", "b2"]  # rank 0 gave 2 requests, rank 1 gave 3
    assert own_rows(outs, [2, 3], 0) == ["a0", "a1"]
    assert own_rows(outs, [2, 3], 1) == ["b0", "b1", "b2"]
    with pytest.raises(ValueError):
        own_rows(outs, [2, 2], 0)


# ---------------------------------------------------------------- single controller: replicas on Ray


def test_single_controller_places_one_worker_per_replica_holding_its_gpus_whole():
    r = _recipe("system.controller=single", "system.rollout.backend=vllm", SPLIT, f"{KEY}=2")
    assert role_slots(r, "rollout") == [[2, 3]]
    assert role_slots(r, "actor") == [[0], [1]]
    assert sorted(bundle_devices(r, r.roles)) == [(0,), (1,), (2, 3)]
    two = _recipe("system.controller=single", "system.rollout.backend=vllm", SPLIT)
    assert role_slots(two, "rollout") == [[2], [3]] and sorted(bundle_devices(two, two.roles)) == [(0,), (1,), (2,), (3,)]


def test_single_controller_server_rollout_is_one_worker_that_starts_every_replicas_server():
    r = _recipe("system.controller=single", "system.rollout.backend=vllm_server", SPLIT)
    assert r.system.rollout_replicas == [[2], [3]]  # two servers
    assert role_slots(r, "rollout") == [[2]]  # started by one worker


def test_single_controller_refuses_a_tensor_parallel_replica_on_trainer_gpus():
    r = _recipe("system.controller=single", "system.rollout.backend=vllm",
                "system.device_map={actor:[0,1],ref:[0,1],critic:[0,1],reward:[0,1],rollout:[0,1]}", f"{KEY}=2")
    with pytest.raises(ConfigError, match=rf"{KEY} 2 under system.controller=single .* GPU 0 is also another role's"):
        check_rollout_replicas(r)
    check_rollout_replicas(_recipe("system.controller=single", "system.rollout.backend=vllm", SPLIT, f"{KEY}=2"))


def test_single_controller_splits_the_batch_over_replicas_not_gpus():
    # 6 samples: three rollout GPUs as one replica take them all; as three replicas, 2 each
    base = ["system.controller=single", "system.rollout.backend=vllm", "system.batch.prompts_per_step=6",
            "system.batch.micro_batch_size=2", "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[1,2,3]}"]
    check_groups(_recipe(*base))
    check_groups(_recipe(*base, f"{KEY}=3"))
    four = base[:-1] + ["system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[1,2,3,4]}"]
    with pytest.raises(ConfigError, match="rollout has 4 rollout replicas"):
        check_groups(_recipe(*four))
    check_groups(_recipe(*four, f"{KEY}=2"))  # two replicas divide 6


# ---------------------------------------------------------------- vLLM servers: one per replica


def test_server_command_takes_the_key_not_the_gpu_count():
    def tp_flag(*sets):
        cmd = server_command(Path("/ckpt"), port=1, recipe=_recipe("system.rollout.backend=vllm_server", SPLIT, *sets),
                             max_len=64, sleep=False)
        return cmd[cmd.index("--tensor-parallel-size") + 1]

    assert tp_flag() == "1" and tp_flag(f"{KEY}=2") == "2"


def test_row_shares_are_contiguous_and_even():
    assert row_shares(6, 2) == [3, 3]
    assert row_shares(7, 3) == [3, 2, 2]
    assert row_shares(1, 2) == [1, 0]
    assert sum(row_shares(257, 4)) == 257


def test_server_rollout_spreads_rows_over_its_servers(monkeypatch):
    """Two replicas: the first half of the rows go to the first server, the rest to the second."""
    from tunekit.trainer.rollout import vllm_server

    seen: dict[str, list[int]] = {}

    def fake_http(method, url, body=None, *, timeout=30.0):
        if url.endswith("/v1/completions"):
            seen.setdefault(url.split("/v1/")[0], []).append(body["prompt"][0])
            n = body["max_tokens"]
            return {"choices": [{"token_ids": [4] * n, "logprobs": {"token_logprobs": [-0.5] * n}}]}
        if url.endswith("/v1/models"):
            return {"data": [{"id": "m"}]}
        return None

    monkeypatch.setattr(vllm_server, "http_json", fake_http)
    monkeypatch.setattr(vllm_server, "http_text", lambda url, timeout=5.0: "")

    rollout = VLLMServerRollout.__new__(VLLMServerRollout)
    rollout.__dict__.update(device=torch.device("cpu"), pad_id=0, eos_id=2, max_new_tokens=3, temperature=1.0,
                            fixed_length=True, logprobs=True, model="m", timeout_s=5.0, actor_version=0,
                            server_version=0,
                            replicas=[vllm_server.Replica("http://a:1"), vllm_server.Replica("http://b:2")],
                            pool=vllm_server.ThreadPoolExecutor(max_workers=4), url="http://a:1")
    prompts = {"prompt_ids": torch.tensor([[10], [11], [12], [13], [14]]), "prompt_mask": torch.ones(5, 1)}
    ids, logp = rollout.generate(prompts, seed=1)
    assert ids.shape == logp.shape == (5, 3)
    assert seen == {"http://a:1": [10, 11, 12], "http://b:2": [13, 14]}
    rollout.logprobs = False  # system.rollout.logprobs=false: the same rows, none asked for
    ids, logp = rollout.generate(prompts, seed=1)
    assert ids.shape == (5, 3) and logp is None


def test_trl_gets_the_tensor_parallel_size_and_the_replicas():
    colo = _recipe("runner=trl", "algorithm.name=grpo", "system.batch.samples_per_prompt=2",
                   "system.rollout.backend=vllm", "system.rollout.enforce_eager=false", "system.rollout.torch_compile=true",
                   "system.device_map={actor:[0,1],ref:[0,1],reward:[0,1],rollout:[0,1],critic:[0,1]}", f"{KEY}=2")
    assert grpo_args(colo, gpu=True)["vllm_tensor_parallel_size"] == 2
    server = _recipe("runner=trl", "algorithm.name=grpo", "system.batch.samples_per_prompt=2",
                     "system.rollout.backend=vllm_server", SPLIT)
    args = server_args(server)
    assert args[args.index("--tensor-parallel-size") + 1] == "1" and args[args.index("--data-parallel-size") + 1] == "2"


def test_verl_gets_the_tensor_parallel_size():
    from tunekit.runners.verl import overrides

    r = _recipe("runner=verl", "system.controller=single", "system.rollout.backend=vllm", "algorithm.name=grpo",
                "system.batch.samples_per_prompt=2",
                "system.device_map={actor:[0,1],ref:[0,1],critic:[0,1],reward:[0,1],rollout:[0,1]}", f"{KEY}=2")
    o = overrides(r, model="/ckpt", data_dir="/data", steps=20)
    assert o["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2


# ---------------------------------------------------------------- memory verdict


def test_engine_weights_split_over_tp_in_the_memory_verdict():
    sets = ["model.preset=qwen2.5-7b", "system.rollout.backend=vllm", "system.rollout.gpu_memory_utilization=0.1",
            "algorithm.name=grpo", "system.batch.samples_per_prompt=2", "system.memory.param_offload=true",
            "system.device_map={actor:[0,1],ref:[0,1],critic:[0,1],reward:[0,1],rollout:[0,1]}"]
    one, two = _recipe(*sets), _recipe(*sets, f"{KEY}=2")
    shape = model_shape(one)
    t = runner_for(one).traits
    rollout = {tp: next(r for r in estimate_memory(rec, shape, 80.0, traits=t).roles if r.role == "rollout")
               for tp, rec in ((1, one), (2, two))}
    assert rollout[2].engine_weights == pytest.approx(rollout[1].engine_weights / 2)
    assert rollout[1].engine_weights == pytest.approx(2 * shape.n_params)  # bf16
    # a 10% pool of an 80 GiB card (8 GiB) cannot hold 7B's 14 GiB of bf16 weights, but holds half of them
    assert "rollout engine's weights on GPU 0" in would_not_fit(one, 80.0, traits=t)
    assert would_not_fit(two, 80.0, traits=t) is None
    assert estimate_memory(one, shape, 80.0, traits=t).verdict == "would not fit"


# ---------------------------------------------------------------- search


def test_tensor_parallel_size_is_a_systems_knob_in_the_recipes_spaces():
    assert is_systems_key(KEY)
    for name in ("qwen2.5-7b", "qwen2.5-1.5b"):
        r = load_recipe(name)
        assert KEY in [p.key for p in r.search.space]
        check_space(r, name)


# ---------------------------------------------------------------- GPU


_GREEDY = textwrap.dedent("""
    import json, sys
    import torch
    from vllm import SamplingParams
    from tunekit.config import load_recipe
    from tunekit.placement.dist import Dist
    from tunekit.trainer.build import build_rollout, load_tokenizer

    tp = int(sys.argv[1])
    recipe = load_recipe(None, ["system.rollout.backend=vllm", "system.rollout.gpu_memory_utilization=0.2",
                                "system.controller=single",
                                "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:%s}"
                                % ([0, 1] if tp == 2 else [0]), "system.rollout.tensor_parallel_size=%d" % tp])
    tok = load_tokenizer(recipe)
    rollout = build_rollout(recipe, Dist(device=torch.device("cuda", 0)), tok)
    prompts = [{"prompt_token_ids": tok(p)["input_ids"]} for p in ["1+2=", "13+4=", "7+19=", "20+20=", "5+0="]]
    outs = rollout.llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
""")


@pytest.mark.gpu
def test_gpu_tp2_engine_generates_the_tokens_of_a_tp1_engine():
    reason = vllm_gpu_skip(2)
    if reason:
        pytest.skip(reason)
    root = Path(__file__).resolve().parents[1]
    tokens = {}
    for tp in (1, 2):  # each engine in a process of its own, as a rollout worker holds it
        out = subprocess.run([sys.executable, "-c", _GREEDY, str(tp)], capture_output=True, text=True, timeout=400,
                             cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)})
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("TOKENS ")]
        assert lines, out.stderr[-3000:]
        tokens[tp] = json.loads(lines[-1].removeprefix("TOKENS "))
    assert tokens[2] == tokens[1]


@pytest.mark.gpu
def test_gpu_spmd_engine_spans_two_ranks_and_stays_on_policy(tmp_path):
    reason = vllm_gpu_skip(2)
    if reason:
        pytest.skip(reason)
    from tunekit.launch.probe import run_probe
    from tunekit.rundir import read_steps

    r = load_recipe(None, ["probe.steps=3", "probe.warmup_steps=1", "profiler.comm_steps=0",
                           "system.batch.prompts_per_step=32", "system.rollout.backend=vllm",
                           "system.rollout.gpu_memory_utilization=0.3",
                           "system.device_map={actor:[0,1],ref:[0,1],critic:[0,1],reward:[0,1],rollout:[0,1]}",
                           f"{KEY}=2"])
    result = run_probe(r, out=tmp_path)
    assert result.status == "ok", result.summary["reason"]
    steps = read_steps(result.run_dir)
    assert (steps["rollout/weight_sync_bytes"] > 0).all()
    assert steps["rollout/logprob_abs_diff_mean"].max() < 0.1


# ---------------------------------------------------------------- the two-GPU benchmark's plan


def _bench():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "rollout_tp.py"
    spec = importlib.util.spec_from_file_location("rollout_tp_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_plan_fits_the_7b_probe_and_skips_the_too_large_one(capsys):
    bench = _bench()
    assert bench.dry_run(SimpleNamespace(prompts=64, probe_tp=2)) == 0
    lines = {ln.split(":")[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert lines["7B probe"].endswith(": fits") and "rollout replicas [[0, 1]]" in lines["7B probe"]
    assert lines["too-large 7B"].endswith(": would not fit")
    row = bench.too_large(Path("/nonexistent"), run_it=False, timeout=60)
    assert row["verdict"].startswith("skipped: would not fit")


def test_benchmark_table_reads_a_probe_cut_short():
    bench = _bench()
    table = bench.markdown({"meta": {"date": "2026-01-01", "command": "c"},
                            "engines": [{"preset": "p", "tp1_one_gpu_tokens_per_s": 100.0, "tp2_tokens_per_s": 150.0,
                                         "tp1_x2_replicas_tokens_per_s": 200.0}],
                            "probe_7b": {"status": "timeout", "phases_s": {"gen": 2.0}, "nccl_s_per_step": {}}})
    assert "| p | 100 | 150 | 200 | 0.75 |" in table and "7B probe: timeout" in table and "gen 2" in table
