"""The terminal view of a finished search: what it prints, in which order."""

from __future__ import annotations

import io
import re

from rich.console import Console

from tunekit.search.result import SearchResult
from tunekit.search.view import print_search


def trial(n: int, **kw) -> dict:
    row = {"number": n, "baseline": False, "duplicate_of": None, "status": "ok", "verdict": "feasible",
           "feasible": True,
           "params": {"system.batch.micro_batch_size": 2 ** n, "system.memory.gradient_checkpointing": n % 2 == 0},
           "reason": "", "reward": 0.5, "reward_ci": [0.4, 0.6], "projected_steps": 100, "projected_yuan": 10.0 - n,
           "probe_yuan": 0.1}
    return row | kw


def result(**kw) -> SearchResult:
    trials = [trial(0, baseline=True), trial(1, duplicate_of=0), trial(2, reward=0.52), trial(3)]
    base = {"study": "s", "storage": "sqlite:///s.db", "out_dir": "/out", "recipe": "tiny-grpo", "profile": "h200",
            "budget_yuan": 5.0, "spent_yuan": 1.234, "stop_reason": "reached 4 trials", "reward_threshold": 0.5,
            "reward_window": 10, "reward_metric": "reward/mean", "probe_steps": 20, "run": {"until": "threshold"},
            "trials": trials,
            "best": trials[2], "baseline": trials[0], "saving_yuan": 2.0, "saving_pct": 25.0,
            "command": "tunekit probe --recipe best.yaml", "notes": ["a note"],
            "learning": {"pairs_compared": 3, "mismatches": []}}
    return SearchResult(**(base | kw))


def printed(r: SearchResult) -> list[str]:
    out = io.StringIO()
    print_search(Console(file=out, width=220, color_system=None), r)
    return [line.strip() for line in out.getvalue().splitlines() if line.strip()]


def in_order(lines: list[str], starts: list[str]) -> list[int]:
    return [next(i for i, line in enumerate(lines) if line.startswith(s)) for s in starts]


def test_a_confirmed_search_prints_table_spend_round_verdict_answer_saving_notes_and_command():
    confirmation = {"seeds": [1, 2], "spent_yuan": 0.5, "final_verdict": "confirmed", "named": [2, 3],
                    "configurations": [], "ratios_vs_baseline": {}}
    reaches = {"lines": ["trial 2 reaches the threshold 0.5: reward 0.520 [0.400, 0.600] over seeds 0, 1, 2",
                         "the search itself cost 1.234 yuan in probes; the saving of 2 yuan a run pays for it after 1 full run(s)"]}
    lines = printed(result(confirmation=confirmation, verdict="confirmed", answer="confirmed: trial 2 is cheaper",
                           reaches=reaches))
    assert lines[0] == "p1 system.batch.micro_batch_size  p2 system.memory.gradient_checkpointing"
    rows = {line.split()[0]: line.split()[1:3] for line in lines if line[:1].isdigit()}
    assert rows == {"0b": ["1", "on"], "1=0": ["2", "off"], "2*": ["4", "on"], "3": ["8", "off"]}
    expect = ["study s: 4 trial(s)", "stopped: reached 4 trials",
              "probe spend: 1.234 of 5 yuan (profile h200), of which the confirmation round 0.5",
              "confirmation round: seeds 1, 2",
              "answer: trial 2 reaches the threshold 0.5: reward 0.520 [0.400, 0.600] over seeds 0, 1, 2",
              "full run: trial 2, projected 8 yuan",
              "saving vs baseline (trial 0, 10 yuan): 2 yuan (25.0%)",
              "the search itself cost 1.234 yuan in probes; the saving of 2 yuan a run pays for it after 1 full run(s)",
              "why: confirmed: trial 2 is cheaper", "note: a note",
              "systems-knob check: 3 pair(s)", "run it: tunekit probe --recipe best.yaml",
              "all trials: /out/search.json"]
    at = in_order(lines, expect)
    assert at == sorted(at) and lines[-1] == "all trials: /out/search.json"


def test_a_search_stopped_before_its_end_offers_its_answer_so_far_not_as_the_answer():
    lines = printed(result(stop_reason="time limit: 500 s of --time-limit 540 s used", resume="tunekit search ... --resume"))
    assert "run the answer so far: tunekit probe --recipe best.yaml" in lines
    assert not any(line.startswith("run it:") for line in lines) and lines[-1].startswith("not finished: continue with:")


def test_without_a_round_or_an_answer_the_verdict_is_one_line_and_nothing_else_is_claimed():
    lines = printed(result(best=None, saving_yuan=None, saving_pct=None, command=None, verdict="none", notes=[],
                           answer="no trial reached the threshold", run={"samples": 1000},
                           reaches={"lines": ["no configuration reaches the threshold 0.5; the closest is trial 2"]},
                           learning={"pairs_compared": 3, "mismatches": [{"sentence": "x"}]}))
    assert "full run: 1000 samples" in " ".join(lines)
    last = ["stopped:", "probe spend: 1.234 of 5 yuan (profile h200)",
            "answer: no configuration reaches the threshold 0.5; the closest is trial 2", "all trials:"]
    assert in_order(lines, last) == list(range(len(lines) - 4, len(lines)))
    assert not any(line.startswith(("full run:", "saving", "run it:", "systems-knob", "why", "note:"))
                   for line in lines)


SIX_KNOBS = {"algorithm.name": "ppo", "system.batch.prompts_per_step": 32, "system.batch.micro_batch_size": 16,
             "system.memory.gradient_checkpointing": False, "system.batch.samples_per_prompt": 4,
             "system.device_map": '{"actor":[0],"critic":[0],"ref":[0],"reward":[0],"rollout":[0]}'}


def test_at_80_columns_every_row_shows_its_figures_whole_and_nothing_is_cut():
    def knobs(n: int) -> dict:
        return SIX_KNOBS | {"algorithm.name": ["ppo", "grpo", "reinforce"][n % 3], "system.batch.micro_batch_size": 2 ** n,
                            "system.memory.gradient_checkpointing": n % 2 == 1}

    trials = [trial(n, params=knobs(n), reward=0.486 + n / 1000, reward_ci=[0.4528 + n / 1000, 0.5206 + n / 1000],
                    projected_steps=1000 * n + 1000, projected_yuan=1234.5 / (n + 1), probe_yuan=0.0117 * (n + 1))
              for n in range(11)]
    trials[0]["baseline"] = True
    trials[3]["duplicate_of"] = 1
    trials[4] |= {"status": "pruned", "verdict": None, "reward": None, "reward_ci": None, "projected_steps": None,
                  "projected_yuan": None, "reason": "pruned on cost: projected >= 3.5 yuan after 7 steps"}
    trials[7] |= {"verdict": "infeasible", "reward": 0.31, "reward_ci": [0.27, 0.35], "projected_steps": None,
                  "projected_yuan": None}
    trials[9] |= {"verdict": "within noise", "reward": 0.4, "reward_ci": [0.38, 0.42]}
    console = Console(width=80, record=True, file=io.StringIO())
    print_search(console, result(trials=trials, best=trials[10], baseline=trials[0], confirmation=None, verdict="feasible",
                                 answer="trial 10 is cheapest", reaches={}))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80
    assert "95% interval" in " ".join(text.split())  # the title wraps, it is not cut
    rows: dict[int, list[str]] = {}  # a trial's words, wherever its number starts a line
    for line in text.splitlines():
        if m := re.match(r" *(\d+)[*br]*(=\d+)? ", line):
            rows.setdefault(int(m[1]), []).extend(line.split())
    assert sorted(rows) == list(range(11))
    for t in trials:
        ci = f"{t['reward_ci'][0]:.3f}-{t['reward_ci'][1]:.3f}" if t["reward_ci"] else "-"
        yuan = f"{t['projected_yuan']:.3g}" if t["projected_yuan"] is not None else "-"
        assert {ci, yuan, f"{t['probe_yuan']:.2g}"} <= set(rows[t["number"]]), (t["number"], rows[t["number"]])


def test_at_80_columns_the_memory_table_keeps_every_role_total():
    from tunekit.estimate.memory import GIB, GpuMemory, MemoryEstimate, RoleMemory
    from tunekit.search.view import print_memory

    eight = tuple(range(8))
    roles = [RoleMemory("actor", eight, 1.75 * GIB, 1.75 * GIB, 7 * GIB, 12.345 * GIB, slack=3.2 * GIB),
             RoleMemory("critic", eight, 1.75 * GIB, 1.75 * GIB, 7 * GIB, 10.1 * GIB, slack=2 * GIB),
             RoleMemory("rollout", eight, engine=56.789 * GIB, engine_sleeps=True)]
    console = Console(width=80, record=True, file=io.StringIO())
    print_memory(console, MemoryEstimate(roles, [GpuMemory(0, ("actor", "critic", "rollout"), 120 * GIB, 139.8 * GIB)]),
                 "h200")
    rows = [line.split() for line in console.export_text().splitlines() if line.startswith(("actor", "critic", "rollout"))]
    assert [row[-1] for row in rows] == ["26.05", "22.60", "56.79"]


def test_the_progress_counts_a_resumed_studys_trials_and_draws_no_bars_into_a_log():
    from tunekit.search.view import SearchProgress

    out = io.StringIO()
    with SearchProgress(Console(file=out, width=100), 4) as view:  # a file, not a terminal
        view({"event": "start", "done": 3, "retried": [3]})
        view({"event": "trial", "number": 3, "params": {"system.batch.micro_batch_size": 8}, "steps": 10})
        assert view.bar.tasks[view.trials].completed == 3
    text = out.getvalue()
    assert "resuming: trial(s) 3" in text and "━" not in text


def test_the_progress_bar_ends_on_the_whole_spend_and_the_answer_not_its_last_trial():
    """The bar stays on screen: after the confirmation round it must say what the answer says, with the round's
    spend, not the best trial of the last budget check."""
    from tunekit.search.view import SearchProgress

    out = io.StringIO()
    with SearchProgress(Console(file=out, width=200, force_terminal=True), 4) as view:
        view({"event": "start", "done": 0})
        view({"event": "budget", "done": 4, "spent": 0.0054, "budget": 0.2,
              "best": "trial 2, 0.007392 yuan, reaches the threshold within noise"})
        view({"event": "stop", "reason": "reached 4 trials", "spent": 0.0111, "budget": 0.2,
              "best": "trial 0, 0.01079 yuan, reaches the threshold"})
        last = view.bar.tasks[view.trials].description
        view({"event": "stop", "reason": "time limit", "spent": 0.0111, "budget": 0.2, "final": False,
              "best": "trial 0, 0.01079 yuan, reaches the threshold"})
        stopped = view.bar.tasks[view.trials].description
    assert "best so far: trial 0" in stopped  # a search stopped to resume has no answer yet
    assert "spent 0.0111 / 0.2 yuan" in last and "answer: trial 0, 0.01079 yuan, reaches the threshold" in last
