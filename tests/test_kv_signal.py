"""The KV-cache signal: vLLM's Prometheus metrics (as ``LLM.get_metrics()`` returns them) → per-step
``rollout/kv_usage_peak`` and ``rollout/preemptions`` (a real engine's record: tests/test_rollout_vllm.py, gpu)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tunekit.trainer.rollout.engine_io import KVCacheWatch, engine_stats, kv_signal, prometheus_samples


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
