"""A verl probe's start-up parts, read off verl's output as it arrives: the lines are verl 0.9's own (its V1
trainer's ``_setup`` log, ``run_ppo``'s and ``LLMServerManager``'s prints, Ray's start line) as Ray relays them."""

from __future__ import annotations

import time

import pytest

from tunekit.runners.verl_startup import MOST_RELAY_S, SPAWNED, StartupLines, logged_at

T0 = 1_795_000_000.0  # verl's process started (a fixed epoch second; stamps below are written in local time)


def stamp(at: float) -> str:
    """``at`` as Python's logging writes ``%(asctime)s``: local time, milliseconds after a comma."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f",{round((at % 1) * 1000):03d}"


def verl_log(at: float, message: str) -> str:
    """A line of verl's task runner as Ray relays it: the actor's prefix, then verl's ``LEVEL:asctime:message``."""
    return f"(TaskRunnerV1 pid=4242) INFO:{stamp(at)}:{message}"


def start_lines(relay_s: float = 0.4) -> list[tuple[float, str]]:
    """(arrival, line): verl's start from its entry process to ``ready to fit``, with the noise around its
    milestones (its config dump, the vLLM server's arguments), each logged line arriving ``relay_s`` late."""
    return [
        (T0 + 8.0, "ray init kwargs: {'num_cpus': None, 'include_dashboard': False, 'runtime_env': {'env_vars': "
                   "{'TOKENIZERS_PARALLELISM': 'true', 'VLLM_LOGGING_LEVEL': 'WARN'}}}"),
        (T0 + 12.5 + relay_s, f"{stamp(T0 + 12.5)}\tINFO worker.py:2027 -- Started a local Ray instance."),
        (T0 + 16.0, "(TaskRunnerV1 pid=4242) {'actor_rollout_ref': {'actor': {'strategy': 'fsdp', 'ray_kwargs': "
                    "{'ray_init': {'num_cpus': None}}}}"),
        (T0 + 19.0 + relay_s, verl_log(T0 + 19.0, "Total training steps: 20")),
        (T0 + 21.0 + relay_s, verl_log(T0 + 21.0, "worker group kwargs: {'device_name': 'cuda'}")),
        (T0 + 24.0 + relay_s, verl_log(T0 + 24.0, "create worker group dict_keys(['actor_rollout'])")),
        (T0 + 61.0 + relay_s, verl_log(T0 + 61.0, "actor and ref model engine initialized")),
        (T0 + 67.0 + relay_s, verl_log(T0 + 67.0, "reward loop manager initialized")),
        (T0 + 75.0, "(vLLMHttpServer pid=5151) ['serve',"),
        (T0 + 75.0, "(vLLMHttpServer pid=5151)  '/tmp/tunekit-verl-x/model',"),
        (T0 + 200.0, "(TaskRunnerV1 pid=4242) LLMServerManager: ['10.0.0.5:41235']"),
        (T0 + 203.0 + relay_s, verl_log(T0 + 203.0, "checkpoint engine manager initialized")),
        (T0 + 206.0 + relay_s, verl_log(T0 + 206.0, "all initialize finished, ready to fit")),
    ]


def read(lines: list[tuple[float, str]]) -> StartupLines:
    seen = StartupLines()
    seen.mark(SPAWNED, T0)
    for arrived, line in lines:
        seen.see(line, arrived)
    return seen


def test_each_part_runs_from_one_verl_milestone_to_the_next():
    parts = read(start_lines()).parts(first_step=T0 + 218.0)
    assert parts == pytest.approx({"imports": 8.0, "ray_start": 4.5, "setup": 8.5, "model_load": 40.0,
                                   "reward_workers": 6.0, "engine_start": 133.0, "weight_sync_setup": 6.0,
                                   "before_first_step": 12.0}, abs=2e-3)
    # the parts tile verl's start: spawn to the first step, nothing counted twice
    assert sum(parts.values()) == pytest.approx(218.0, abs=2e-3)


def test_a_logged_line_counts_when_it_was_logged_not_when_ray_relayed_it():
    late = read(start_lines(relay_s=3.0)).parts(first_step=T0 + 218.0)
    assert late["model_load"] == pytest.approx(40.0, abs=2e-3) and late["ray_start"] == pytest.approx(4.5, abs=2e-3)
    # a stamp the arrival cannot have followed (after it, or from another clock) is not believed
    assert logged_at(verl_log(T0 + 5.0, "x"), T0 + 2.0) == T0 + 2.0
    assert logged_at(verl_log(T0, "x"), T0 + MOST_RELAY_S + 1.0) == T0 + MOST_RELAY_S + 1.0
    assert logged_at("LLMServerManager: ['10.0.0.5:41235']", T0 + 7.0) == T0 + 7.0


def test_a_part_whose_milestone_never_appeared_is_left_out():
    lines = [(at, line) for at, line in start_lines() if "reward loop manager" not in line]
    parts = read(lines).parts(first_step=T0 + 218.0)
    assert "reward_workers" not in parts and "engine_start" not in parts  # both end or start at the missing line
    assert parts["model_load"] == pytest.approx(40.0, abs=2e-3) and parts["before_first_step"] == pytest.approx(12.0, abs=2e-3)
    # no first step (verl failed before it): nothing after its last milestone; the first line of a kind counts
    again = read([*start_lines(), (T0 + 300.0, verl_log(T0 + 300.0, "actor and ref model engine initialized"))])
    assert "before_first_step" not in again.parts(first_step=None)
    assert again.parts(first_step=None)["model_load"] == pytest.approx(40.0, abs=2e-3)
    # milestones out of order (an earlier one printed late) give no negative part
    swapped = read([(T0 + 9.0, "Started a local Ray instance."), (T0 + 10.0, "ray init kwargs: {}")])
    assert swapped.parts(first_step=None) == {"imports": 10.0}
