"""The rendered page: self-contained, escaped, small enough for 200 probes, honest about missing data."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import plotly.offline
import pytest
from report_synth import write_run, write_search

from tunekit.config import ProbeConfig
from tunekit.report import build_report, plotlyjs
from tunekit.rundir import SampleLog

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
    js, what = plotlyjs.plotly_js()
    assert text.count(js[:300]) == 1 and len(text) < len(js) + 400_000
    assert not re.search(r"<script[^>]+src=", text)  # nothing fetched from the network
    for section in ("headline", "cost", "probes", "phases", "comm", "memory", "rewards", "search", "policy", "drill", "missing"):
        assert re.search(rf"<section id=\"{section}\"( class=\"empty-section\")?>", text)
    assert text.count('class="drill"') == 4
    assert re.findall(r'data-figure="(\w+)"', text) == ["cost", "phases", "comm", "memory", "rewards", "history"]
    assert "No parameter importance: no Optuna study found" in text
    assert "tunekit probe --recipe best.yaml" in re.sub(r"<[^>]+>", "", text)
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


def test_each_probe_shows_its_first_and_last_steps_samples_as_text(tmp_path):
    run = write_run(tmp_path / "runs", "r0")
    samples = SampleLog(run, ProbeConfig(steps=30, samples_per_step=2))
    for step in range(30):
        samples.add(step, [f"{step}+1=", "q"], [EVIL if step == 29 else f"said {step}", "x"], [str(step + 1), None],
                    [step / 29, 0.0])
    text = build_report([tmp_path], tmp_path / "report.html").read_text()
    assert EVIL not in text
    (table,) = re.findall(r'<table class="samples">.*?</table>', text, re.S)
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", table, re.S)]
    # steps 0 and 29 only (not the tenth steps between), two rows each: step, prompt, response, answer, reward
    assert cells == ["0", "0+1=", "said 0", "1", "0", "0", "q", "x", "–", "0",
                     "29", "29+1=", EVIL.replace("<", "&lt;").replace(">", "&gt;"), "30", "1", "29", "q", "x", "–", "0"]
    assert EVIL in "".join(_parse(text).text)


def test_missing_columns_render_and_are_listed(tmp_path):
    write_run(tmp_path, "a", drop_summary=("steady", "cost/projected_yuan", "cost/projected_gpu_hours", "cost/projected_wall_s"),
              drop_steps=("timing_s/step", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"), nvml_samples=0)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text(json.dumps({"status": "ok", "recipe": "old"}))
    text = build_report([tmp_path], tmp_path / "report.html").read_text()
    assert "summary.json has no cost/projected_yuan: run 1, run 2" in text
    assert "no steps.parquet: run 2" in text and "no config.yaml: run 2" in text
    assert "Some records are incomplete" in text
    assert "No configuration ran to its end with a projected cost and a reward." in text


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
    assert "No probe records found" in text and "From Optuna study x; 4 trials." in text and 'id="probes"' not in text


def test_the_basic_bundle_is_inlined_when_it_matches_plotly_py():
    js, what = plotlyjs.plotly_js(plotlyjs.BUNDLE_VERSION)
    assert plotlyjs.bundle_version(js) == plotlyjs.BUNDLE_VERSION and "basic" in js[:200] and "basic bundle" in what
    assert len(js) < 1.5e6  # vs 4.8 MB for the full bundle
    assert "basic bundle" in plotlyjs.plotly_js("4.1.9")[1]  # a patch release adds no attributes
    js, what = plotlyjs.plotly_js("4.2.0")  # another plotly.py: its own full bundle, which knows its figures
    assert js == plotly.offline.get_plotlyjs() and "full bundle" in what
    assert (plotlyjs.BUNDLE.parent / "plotly-basic.LICENSE").read_text().startswith("MIT License")


def test_installed_plotly_matches_the_vendored_bundle():
    # When this fails, plotly.py was upgraded: vendor npm plotly.js-basic-dist-min of plotly.offline.get_plotlyjs_version().
    assert plotlyjs.same_minor(plotly.offline.get_plotlyjs_version(), plotlyjs.BUNDLE_VERSION)


def _headers(text: str) -> list[str]:
    table = text.split('id="probe-table"', 1)[1].split("</thead>", 1)[0]
    return re.findall(r"<th(?: [^>]*)?>(.*?)</th>", table)


def test_table_puts_the_differing_knobs_first_and_skips_empty_metrics(tmp_path):
    runs = [write_run(tmp_path / "runs", f"r{i}", reward=0.6, yuan=10 + i, seed=i, nvml_samples=0,
                      overrides=(f"system.batch.micro_batch_size={2 ** i}",)) for i in range(3)]
    write_search(tmp_path, runs, best=0, baseline=1)
    text = build_report([tmp_path], tmp_path / "report.html").read_text()
    heads = _headers(text)
    # what each configuration came to first, then its knobs, the differing ones first
    assert heads[:3] == ["probe", "outcome", "reward"]
    first_knob = next(i for i, h in enumerate(heads) if h == "batch.micro_batch_size")
    assert heads.index("projected ¥") < first_knob < heads.index("algorithm.name")
    for empty in ("NVML GB", "MFU actor %", "MFU critic %", "threshold", "reason", "reward interval"):
        assert empty not in heads
    assert ">trial 0</a>" in text and "P00" not in text


def test_running_search_and_empty_sections_say_why_in_one_line(tmp_path):
    run = write_run(tmp_path / "runs", "r0", nvml_samples=0, drop_steps=("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb",
                                                                        "comm/total_s/update_actor", "comm/exposed_s/update_actor",
                                                                        "comm/wait_s/update_actor", "comm/total_s/gen", "comm/exposed_s/gen",
                                                                        "comm/wait_s/gen"))
    write_search(tmp_path, [run], best=0, baseline=0, stop_reason="running")
    text = build_report([tmp_path], tmp_path / "report.html").read_text()
    assert "stopped: running" not in text and "had not finished" in text
    for sid, why in (("comm", "single rank"), ("memory", "ran on CPU")):
        sec = re.search(rf'<section id="{sid}" class="empty-section">(.*?)</section>', text, re.S)
        assert sec and why in sec.group(1) and "data-figure" not in sec.group(1)
    nav = text.split("<nav>", 1)[1].split("</nav>", 1)[0]
    assert 'href="#comm"' not in nav and 'href="#probes"' in nav


def test_mixed_recipes_say_they_are_a_comparison_not_a_search(tmp_path):
    write_run(tmp_path, "1-a", overrides=("name=alpha",))
    write_run(tmp_path, "2-b", overrides=("name=beta",), seed=1)
    text = build_report([tmp_path], tmp_path / "report.html").read_text()
    assert "A comparison of 2 runs of 2 recipes (alpha, beta), not a search" in text
    assert "<title>tunekit report · comparison of runs</title>" in text
    head = text.split('id="headline"', 1)[1].split("</section>", 1)[0]
    assert "Compared with" not in head and "saving vs" not in head and "Cheapest run that reaches its recipe" in head
    assert "No search history: these runs were not sampled" in text
    one = tmp_path / "one"
    write_run(one, "1-a", overrides=("name=alpha",))
    text = build_report([one], tmp_path / "one.html").read_text()
    assert "One run of the recipe alpha, not a search." in text and "A comparison of" not in text


def test_the_command_box_wraps_at_spaces():
    from tunekit.report.page import command_html

    css = (plotlyjs.BUNDLE.parent / "template.html").read_text()
    rule = re.search(r"pre\.cmd \{([^}]*)\}", css).group(1)
    assert "break-all" not in rule and "pre-wrap" in rule
    assert re.search(r"pre\.cmd \.w \{[^}]*display: inline-block", css)  # a word breaks only when longer than the line
    html = command_html("tunekit probe --set 'a={\"b\":[0]}' --steps 4")
    words = re.findall(r'<span class="w">(.*?)</span>', html)
    assert words == ["tunekit", "probe", "--set", "&#x27;a={&quot;b&quot;:[0]}&#x27;", "--steps", "4"]
    assert re.sub(r"<[^>]+>", "", html).replace("&#x27;", "'").replace("&quot;", '"') == "tunekit probe --set 'a={\"b\":[0]}' --steps 4"


def test_confirmation_round_is_shown_when_recorded_and_left_out_otherwise(tmp_path):
    runs = [write_run(tmp_path / "runs", f"r{i}", reward=0.6, yuan=10 + i, seed=i) for i in range(2)]
    write_search(tmp_path, runs, best=1, baseline=0)
    assert 'id="confirm"' not in build_report([tmp_path], tmp_path / "a.html").read_text()
    write_search(tmp_path, runs, best=1, baseline=0, confirmation={"running": True, "probes": [{"trial": 1, "seed": 1}], "spent_yuan": 0.1})
    assert "The confirmation round had not finished: 1 probe(s) so far" in build_report([tmp_path], tmp_path / "b.html").read_text()
    write_search(tmp_path, runs, best=1, baseline=0, confirmation={"verdict": "within noise", "sentence": f"trial 1 and {EVIL} are close",
                                                                  "configurations": [{"trial": 1, "verdict": "feasible"}]})
    text = build_report([tmp_path], tmp_path / "c.html").read_text()
    sec = text.split('<section id="confirm">', 1)[1].split("</section>", 1)[0]
    assert "<b>within noise</b>: trial 1 and &lt;script&gt;" in sec and "<td>trial 1</td><td>feasible</td>" in sec


def test_the_searchs_answer_is_in_the_headline(tmp_path):
    runs = [write_run(tmp_path / "runs", f"r{i}", reward=0.6, yuan=10 + i, seed=i) for i in range(2)]
    write_search(tmp_path, runs, best=0, baseline=1, verdict="confirmed", answer="trial 0 confirmed: 0.91 [0.88, 0.95] of the baseline's")
    head = build_report([tmp_path], tmp_path / "a.html").read_text().split('id="headline"', 1)[1].split("</section>", 1)[0]
    assert '<p class="answer why"><b>confirmed</b>: trial 0 confirmed: 0.91 [0.88, 0.95] of the baseline&#x27;s</p>' in head


def test_a_top_two_within_noise_is_named_as_a_pair_in_the_headline(tmp_path):
    runs = [write_run(tmp_path / "runs", f"r{i}", reward=0.6, yuan=10 + i, seed=i) for i in range(3)]
    final = "top two within noise: trials 2 and 1"
    write_search(tmp_path, runs, best=1, baseline=0, verdict="within noise", answer=final + ": 0.98x [0.87, 1.11]",
                 confirmation={"verdict": "within noise", "named": [2, 1], "winner": 1, "baseline": 0,
                               "final_verdict": final, "sentence": final + ": 0.98x [0.87, 1.11]"})
    head = build_report([tmp_path], tmp_path / "a.html").read_text().split('id="headline"', 1)[1].split("</section>", 1)[0]
    assert "<h2>Top two within noise: trials 2 and 1 (the command runs trial 1)</h2>" in head
    assert "Cheapest configuration" not in head
    # one configuration named: the usual title
    write_search(tmp_path, runs, best=1, baseline=0, verdict="confirmed", answer="confirmed: trial 1",
                 confirmation={"verdict": "confirmed", "named": [1], "winner": 1, "final_verdict": "confirmed: trial 1"})
    head = build_report([tmp_path], tmp_path / "b.html").read_text().split('id="headline"', 1)[1].split("</section>", 1)[0]
    assert "<h2>Cheapest configuration that reaches the threshold: trial 1</h2>" in head


def test_when_the_answer_is_the_baseline_there_is_no_saving_to_compare(tmp_path):
    runs = [write_run(tmp_path / "runs", f"r{i}", reward=0.6, yuan=10 + i, seed=i) for i in range(2)]
    write_search(tmp_path, runs, best=0, baseline=0)
    head = build_report([tmp_path], tmp_path / "a.html").read_text().split('id="headline"', 1)[1].split("</section>", 1)[0]
    assert ("trial 0 is the baseline, the configuration the search started from: there is no saving against it to "
            "report.") in head
    assert "saving vs baseline" not in head and "Compared with" not in head and "references" not in head
    # with a reference to price it against, the headline points at that line of the answer
    against = [{"name": "trl-defaults", "trial": 1, "reference": True, "priced": True,
                "text": "against trl-defaults (trial 1): saving"}]
    write_search(tmp_path, runs, best=0, baseline=0, reaches={"trial": 0, "against": against, "lines": []})
    head = build_report([tmp_path], tmp_path / "b.html").read_text().split('id="headline"', 1)[1].split("</section>", 1)[0]
    assert "report (its cost against the references is in the answer above)." in head


def test_memory_section_says_each_gpus_headroom_and_what_the_kv_cache_did(tmp_path):
    root = tmp_path / "runs"
    starved = write_run(root, "starved", seed=1, extra={
        "memory/card_gb": 141.0, "memory/estimate_gb": 30.0, "rollout/kv_usage_peak": 0.98, "rollout/preemptions": 12.5})
    idle = write_run(root, "idle", seed=2, extra={"memory/card_gb": 141.0, "rollout/kv_usage_peak": 0.009,
                                                  "rollout/preemptions": 0.0})
    write_run(root, "hf", seed=3)  # no card known, no engine: no line
    text = build_report([root], tmp_path / "report.html").read_text()
    memory_section = text[text.index('<section id="memory"'):].split("</section>")[0]
    peak = json.loads((starved / "summary.json").read_text())["nvml/mem_used_gb/0"]
    lines = re.findall(r"<li><b>run \d</b>: (.*?)</li>", memory_section)
    assert len(lines) == 2  # the probe without a known card or an engine has nothing to say
    starved_line = next(li for li in lines if "starved" in li)
    assert starved_line.startswith(f"GPU 0: {141 - peak:.1f} GiB free: peak {peak:.1f} of 141 GiB")
    assert "estimated 30.0 GiB; rollout KV cache: memory-starved: 12.5 requests preempted a step" in starved_line
    idle_peak = json.loads((idle / "summary.json").read_text())["nvml/mem_used_gb/0"]
    assert f"GPU 0: {141 - idle_peak:.1f} GiB free" in memory_section
    assert "99% of the KV cache idle at its fullest (0.9% used, no preemptions)" in memory_section


def test_a_pruned_row_shows_its_cost_as_the_bound_it_was_pruned_at_and_no_reward(tmp_path):
    runs = [write_run(tmp_path / "runs", "t0", reward=0.7, yuan=10.0),
            write_run(tmp_path / "runs", "t1", status="pruned", reason="pruned on cost", seed=1,
                      extra={"cost/projected_yuan": 55.0})]
    write_search(tmp_path, runs, best=0, baseline=0)
    text = build_report([tmp_path], tmp_path / "report.html").read_text()
    table = text.split('id="probe-table"', 1)[1].split("</table>", 1)[0]
    row = next(r for r in table.split("<tr")[1:] if "pruned on cost" in r)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert "≥ 55" in cells and "–" in cells and not any(c.startswith("0.") for c in cells[:4])


def test_runs_of_recipes_with_their_own_thresholds_none_reached_name_no_one_threshold(tmp_path):
    write_run(tmp_path, "1-a", overrides=("name=alpha", "search.reward_threshold=0.9"), reward=0.1)
    write_run(tmp_path, "2-b", overrides=("name=beta", "search.reward_threshold=0.95"), reward=0.1, seed=1)
    head = build_report([tmp_path], tmp_path / "report.html").read_text().split('id="headline"', 1)[1]
    head = head.split("</section>", 1)[0]
    assert "No probe reached its recipe's threshold" in head and "threshold 0.9" not in head
