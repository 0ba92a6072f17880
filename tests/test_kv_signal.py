"""The KV-cache signal: vLLM's Prometheus metrics (as ``LLM.get_metrics()`` returns them) → per-step
``rollout/kv_usage_peak`` and ``rollout/preemptions`` (a real engine's record: tests/test_rollout_vllm.py, gpu)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace

from tunekit.trainer.rollout.engine_io import (
    KVCacheWatch,
    StepTap,
    engine_stats,
    kv_signal,
    step_reading,
    tap_engine_steps,
)


@dataclass
class Gauge:  # the shape of vllm.v1.metrics.reader.Gauge / Counter: name, labels, value
    name: str
    labels: dict
    value: float


Counter = Gauge
LABELS = {"engine": "0", "model_name": "tunekit-rollout"}


def _snapshot(usage: float, preempted: int) -> list:
    return [Gauge("vllm:num_requests_running", LABELS, 12.0), Gauge("vllm:kv_cache_usage_perc", LABELS, usage),
            Counter("vllm:num_preemptions", LABELS, preempted), Counter("vllm:prompt_tokens", LABELS, 4096)]


def test_engine_stats_reads_usage_and_preemptions():
    assert engine_stats(_snapshot(0.375, 7)) == (0.375, 7.0)


def test_engine_stats_over_several_engines_takes_the_fullest_cache_and_all_preemptions():
    two = _snapshot(0.25, 3) + [Gauge("vllm:kv_cache_usage_perc", {"engine": "1"}, 0.75),
                                Counter("vllm:num_preemptions", {"engine": "1"}, 2)]
    assert engine_stats(two) == (0.75, 5.0)


def test_engine_stats_without_the_metrics_is_none():
    assert engine_stats([Gauge("vllm:num_requests_running", LABELS, 1.0)]) == (None, None)


def test_kv_signal_is_the_peak_and_the_preemptions_of_one_generation():
    assert kv_signal([0.1, 0.9, 0.4], 5, 8) == {"rollout/kv_usage_peak": 0.9, "rollout/preemptions": 3}
    assert kv_signal([], None, None) == {}


class _FakeEngine:
    """An engine whose cache fills while ``generate`` runs: the gauge steps through ``levels``, the counter
    rises by one preemption on the way."""

    def __init__(self, levels: list[float]) -> None:
        self.levels, self.usage, self.preempted = levels, 0.6, 10  # 0.6: the previous generation's last step
        self.done = threading.Event()

    def get_metrics(self) -> list:
        return _snapshot(self.usage, self.preempted)

    def generate(self) -> None:
        for level in self.levels:
            self.usage = level
            if level == max(self.levels):
                self.preempted += 1
            threading.Event().wait(0.03)
        self.usage = 0.0


def test_watch_records_the_peak_seen_during_generation_not_before():
    engine = _FakeEngine([0.2, 0.3, 0.5, 0.45, 0.1] * 2)
    with KVCacheWatch(engine.get_metrics, interval_s=0.005) as watch:
        engine.generate()
    assert watch.signal["rollout/preemptions"] == 2
    assert watch.signal["rollout/kv_usage_peak"] == 0.5  # not the 0.6 left over from before



def test_ray_rollout_replicas_report_their_mean():
    from tunekit.trainer.worker_group import mean_metrics

    two = [{"rollout/kv_usage_peak": 0.25, "rollout/preemptions": 0.0, "rollout/staleness_steps": 0.0},
           {"rollout/kv_usage_peak": 0.75, "rollout/preemptions": 4.0}]
    assert mean_metrics(two) == {"rollout/kv_usage_peak": 0.5, "rollout/preemptions": 2.0}
    assert mean_metrics([]) == {}


def test_watch_ignores_the_stale_gauge_when_the_engine_starts_late():
    engine = _FakeEngine([0.2, 0.5, 0.1])
    with KVCacheWatch(engine.get_metrics, interval_s=0.005) as watch:
        threading.Event().wait(0.05)  # the watch polls several times before the engine takes its first step
        engine.generate()
    assert watch.signal["rollout/kv_usage_peak"] == 0.5


class _StatsManager:
    """The shape of vLLM V1's StatLoggerManager as LLMEngine.step calls it: ``record(scheduler_stats=...,
    iteration_stats=..., mm_cache_stats=...)`` once a step; its loggers keep what it receives."""

    def __init__(self) -> None:
        self.received: list = []

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=None):
        self.received.append((scheduler_stats, iteration_stats))


class _InProcessLLM:
    """A ``vllm.LLM`` whose generation runs engine steps: the cache fills block by block, one request is preempted
    once the cache is full."""

    def __init__(self) -> None:
        self.llm_engine = SimpleNamespace(logger_manager=_StatsManager())

    def step(self, usage: float, preempted: int, positional: bool = False) -> None:
        sched, it = SimpleNamespace(kv_cache_usage=usage, num_running_reqs=3), SimpleNamespace(num_preempted_reqs=preempted)
        if positional:
            self.llm_engine.logger_manager.record(sched, it, None, 0)
        else:
            self.llm_engine.logger_manager.record(scheduler_stats=sched, iteration_stats=it, mm_cache_stats=None)

    def generate(self) -> None:
        for usage, preempted in [(0.25, 0), (0.5, 0), (1.0, 1), (0.75, 0), (0.0, 0)]:
            self.step(usage, preempted)


def test_step_reading_takes_the_usage_and_the_step_preemptions():
    assert step_reading(SimpleNamespace(kv_cache_usage=0.4), SimpleNamespace(num_preempted_reqs=2)) == (0.4, 2.0)
    assert step_reading(SimpleNamespace(gpu_cache_usage=0.3), None) == (0.3, None)  # before vLLM 0.11
    assert step_reading(None, None) == (None, None)


def test_step_tap_sees_every_step_of_a_generation_and_the_loggers_still_do():
    llm = _InProcessLLM()
    tap = StepTap()
    assert tap_engine_steps(llm, tap)
    llm.step(0.9, 4)  # a step before the generation (e.g. the previous one's tail) is not counted
    with tap:
        llm.generate()
    llm.step(0.95, 7)  # nor one after it
    assert tap.signal == {"rollout/kv_usage_peak": 1.0, "rollout/preemptions": 1.0}
    assert [s.kv_cache_usage for s, _ in llm.llm_engine.logger_manager.received] == [0.9, 0.25, 0.5, 1.0, 0.75, 0.0, 0.95]
    with tap:  # a new generation starts from nothing; positional calls are read the same
        llm.step(0.125, 0, positional=True)
    assert tap.signal == {"rollout/kv_usage_peak": 0.125, "rollout/preemptions": 0.0}


def test_an_engine_without_a_stats_manager_is_not_tapped():
    assert not tap_engine_steps(SimpleNamespace(llm_engine=SimpleNamespace(logger_manager=None)), StepTap())
    assert not tap_engine_steps(SimpleNamespace(), StepTap())
    with StepTap() as tap:  # a tap no engine feeds records nothing, so the engine falls back to polling
        pass
    assert tap.signal == {}


def test_engine_stats_reads_the_gauge_under_its_pre_0_11_name():
    assert engine_stats([Gauge("vllm:gpu_cache_usage_perc", LABELS, 0.5)]) == (0.5, None)
