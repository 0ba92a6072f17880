"""The rendered page: self-contained, escaped, small enough for 200 probes, honest about missing data."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import plotly.offline
import pytest
from report_synth import write_run, write_search

from tunekit.report import build_report

EVIL = "<script>alert(1)</script>"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, d):
        self.text.append(d)


def _parse(text: str) -> _Tags:
    p = _Tags()
    p.feed(text)
    return p


def test_report_is_one_file_with_plotly_inlined_once(tmp_path):
    root = tmp_path / "runs"
    runs = [write_run(root, f"2025-{i}", reward=0.4 + 0.1 * i, yuan=10 - i, seed=i,
                      overrides=(f"system.batch.micro_batch_size={2 ** i}",)) for i in range(4)]
    write_search(tmp_path, runs, best=3, baseline=0)
    out = build_report([tmp_path], tmp_path / "r" / "report.html")
    text = out.read_text()
    assert text.count(plotly.offline.get_plotlyjs()[:200]) == 1
    assert not re.search(r"<script[^>]+src=", text)  # nothing fetched from the network
    for section in ("headline", "cost", "probes", "phases", "comm", "memory", "rewards", "search", "policy", "drill", "missing"):
        assert f'<section id="{section}">' in text
    assert text.count('class="drill"') == 4
    assert re.findall(r'data-figure="(\w+)"', text) == ["cost", "phases", "comm", "memory", "rewards", "history"]
    assert "No parameter importance: no Optuna study found" in text
    assert "tunekit probe --recipe best.yaml" in text
    assert list(out.parent.iterdir()) == [out]  # no temporary file left behind


def test_user_strings_render_as_text(tmp_path):
    run = write_run(tmp_path / "runs", "r0", status="failed", reason=f"boom {EVIL}", overrides=(f"name={EVIL}",))
    write_run(tmp_path / "runs", "r1", overrides=("model.path=<img src=x onerror=alert(2)>",), seed=1)
    write_search(tmp_path, [run, tmp_path / "runs" / "r1"], best=1, baseline=1, equivalence=[f"{EVIL} learns differently"],
                 command=f"tunekit probe {EVIL}")
    text = build_report([tmp_path], tmp_path / "report.html").read_text()
    assert EVIL not in text and "onerror=alert(2)>" not in text.replace("onerror=alert(2)&gt;", "")
    parsed = _parse(text)
    assert not [t for t, _ in parsed.tags if t == "img"]
    scripts = [a.get("type") for t, a in parsed.tags if t == "script"]
    assert set(scripts) <= {None, "text/javascript", "application/json"}
    visible = "".join(parsed.text)
    assert EVIL in visible  # shown as text in the table, headline, drill-down and warnings
    assert f"{EVIL} learns differently" in visible and f"boom {EVIL}" in visible
    for spec in re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', text, re.S):
        assert "<" not in spec
        json.loads(spec)


def test_missing_columns_render_and_are_listed(tmp_path):
    write_run(tmp_path, "a", drop_summary=("steady", "cost/projected_yuan", "cost/projected_gpu_hours", "cost/projected_wall_s"),
              drop_steps=("timing_s/step", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"), nvml_samples=0)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text(json.dumps({"status": "ok", "recipe": "old"}))
    text = build_report([tmp_path], tmp_path / "report.html").read_text()
    assert "summary.json has no cost/projected_yuan: P00, P01" in text
    assert "no steps.parquet: P01" in text and "no config.yaml: P01" in text
    assert "Some records are incomplete" in text
    assert "No probe has both a projected cost and a reward." in text


@pytest.mark.slow
def test_two_hundred_probes_stay_under_15_mb(tmp_path):
    root = tmp_path / "runs"
    runs = []
    for i in range(200):
        status = ("ok", "ok", "ok", "oom", "timeout")[i % 5]
        runs.append(write_run(root, f"p{i:03d}", status=status, reason="" if status == "ok" else f"{status} at step 3",
                              reward=0.3 + 0.4 * (i % 7) / 6, yuan=5 + (i * 37) % 50, seed=i, gpus=1 + i % 2,
                              overrides=(f"system.batch.micro_batch_size={(1, 2, 4, 8)[i % 4]}",
                                         f"system.memory.gradient_checkpointing={str(i % 3 == 0).lower()}"), nvml_samples=600))
    write_search(tmp_path, runs, best=1, baseline=0)
    out = build_report([tmp_path], tmp_path / "report.html")
    size = out.stat().st_size
    assert size < 15 * 2**20, f"report is {size / 2**20:.1f} MiB"
    assert out.read_text().count('class="drill"') == 200


def test_a_study_alone_gives_history_and_importance(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path / 'only.db'}"
    study = optuna.create_study(storage=storage, study_name="x")
    dist = {"a": optuna.distributions.FloatDistribution(0, 1), "b": optuna.distributions.CategoricalDistribution(["p", "q"])}
    for i in range(4):  # the run dirs are gone: only the study is left
        study.add_trial(optuna.trial.create_trial(params={"a": i / 4, "b": "pq"[i % 2]}, distributions=dist, value=float(i),
                                                  constraints={"reward": -1.0}, user_attrs={"run_dir": str(tmp_path / "gone")}))
    text = build_report([], tmp_path / "r.html", storage=storage).read_text()
    assert re.findall(r'data-figure="(\w+)"', text) == ["history", "importance"]
    assert "No probes." in text and "From Optuna study x; 4 trials." in text
