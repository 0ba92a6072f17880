"""Terminal view of a search: a live progress display fed by run_search's events, and the final tables."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.columns import Columns
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tunekit import metrics
from tunekit.estimate.costmodel.view import natural_width, whole_numbers
from tunekit.estimate.views import Estimate
from tunekit.estimate.memory import GIB, MemoryEstimate
from tunekit.search.answer import HOLDS
from tunekit.search.result import SearchResult, label


def _yuan(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


class SearchProgress:
    """Two bars: trials (with spend vs budget and best so far) and the running probe's steps."""

    def __init__(self, console: Console, trials: int) -> None:
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console, transient=False,
                            disable=not console.is_terminal)  # a log gets the trials' lines, not redrawn bars
        self.trials = self.bar.add_task("search", total=trials)
        self.probe = self.bar.add_task("probe", total=1, visible=False)
        self.console = console
        self.started = False

    def __enter__(self) -> "SearchProgress":
        return self  # the bars appear at the "start" event, so bad input prints only its error line

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            self.bar.__exit__(*exc)

    def _status(self, e: dict[str, Any], *, final: bool = False) -> str:
        best = e.get("best")
        said = f"answer: {best or 'none reaches the threshold'}" if final else f"best so far: {best or 'none yet'}"
        return f"[bold]search[/bold] spent {_yuan(e.get('spent'))} / {e.get('budget', 0):g} yuan · {said}"

    def __call__(self, e: dict[str, Any]) -> None:
        kind = e["event"]
        if kind == "start":
            self.bar.__enter__()
            self.started = True
            self.bar.update(self.trials, completed=e.get("done", 0))  # a resumed study's trials so far
        if kind == "start" and e.get("retried"):
            self.console.print(f"resuming: trial(s) {', '.join(map(str, e['retried']))} were left unfinished or deferred by a stopped search and are probed first")
        elif kind == "budget":
            self.bar.update(self.trials, completed=e["done"], description=self._status(e))
        elif kind == "stop" and "spent" in e:
            self.bar.update(self.trials, description=self._status(e, final=e.get("final", True)))
        elif kind == "trial":
            what = " ".join(f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in e["params"].items())
            tag = " (baseline)" if e.get("baseline") else ""
            self.bar.update(self.probe, total=e["steps"], completed=0, visible=True,
                            description=f"  trial {e['number']}{tag}: {what}")
        elif kind == "step":
            self.bar.update(self.probe, completed=e["n"])
        elif kind == "done" and e.get("trial") is not None:
            self.console.print(trial_line(e["trial"]), highlight=False)
            self.bar.advance(self.trials)
            self.bar.update(self.trials, description=self._status(e))
        elif kind == "confirm_start":
            self.console.print(f"confirmation round: the top candidates and the baseline again, fresh seeds, alternating "
                               f"(up to {e['probes']} probes)", highlight=False)
        elif kind == "wait":
            self.console.print(f"waiting for trial(s) {', '.join(map(str, e['trials']))}, still running in other workers",
                               highlight=False)
        elif kind == "wait_round":
            self.console.print(f"waiting for the confirmation round, run by worker {e['worker']}", highlight=False)
        elif kind == "confirm_skip":
            self.console.print(e["why"], highlight=False)
        elif kind == "confirm":
            tag = (" (baseline)" if e.get("baseline") else "") + (", again on this machine" if e.get("partner") else "")
            self.bar.update(self.probe, total=e["steps"], completed=0, visible=True,
                            description=f"  confirm trial {e['number']}{tag}, seed {e['seed']}")
        elif kind == "confirm_done":
            self.console.print(f"confirmation: {e['sentence']}", highlight=False)


def _ci(row: dict[str, Any]) -> str:
    ci = row.get("reward_ci")
    return f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""


def trial_line(row: dict[str, Any]) -> str:
    """The live line of a finished trial: the same verdict, reward interval and price as the final table."""
    if row["duplicate_of"] is not None:
        return f"trial {row['number']}: same configuration as trial {row['duplicate_of']} (reused, no probe, no trial used)"
    steps = f" over {row['projected_steps']} steps" if row["projected_steps"] else ""
    reward = f" reward {_yuan(row['reward'], 3)}{_ci(row)}" if row["reward"] is not None else ""
    why = f" ({row['reason'][:120]})" if row["reason"] else ""
    return f"trial {row['number']}: {label(row)}, projected {_yuan(row['projected_yuan'])} yuan{steps}{reward}{why}"


def _short(v: Any, width: int = 22) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    s = str(v)
    if s.startswith("{") and '"actor"' in s:  # a device map: say how many ranks
        import json

        return f"{len({i for idx in json.loads(s).values() for i in idx})}rank"
    return s if len(s) <= width else s[: width - 1] + "…"


def print_search(console: Console, r: SearchResult) -> None:
    """A finished search: its trials, what it spent, the confirmation round, the answer, notes and the command."""
    _print_trials(console, r)
    console.print(f"stopped: {r.stop_reason}", highlight=False)
    console.print(f"probe spend: {r.spent_yuan:.4g} of {r.budget_yuan:g} yuan (profile {r.profile})"
                  + (f", of which the confirmation round {r.confirmation['spent_yuan']:.4g}" if r.confirmation else ""), highlight=False)
    if r.confirmation:
        _print_confirmation(console, r.confirmation)
    _print_answer(console, r)
    for note in r.notes:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    lc = r.learning
    if lc.get("pairs_compared") and not lc.get("mismatches"):
        console.print(f"systems-knob check: {lc['pairs_compared']} pair(s) of probes differing only in systems knobs learned alike within noise",
                      highlight=False)
    if r.command:  # a search stopped before its end may answer otherwise once it has gone on
        said = "run the answer so far" if r.resume else "run it"
        console.print(f"{said}: {r.command}", highlight=False, soft_wrap=True)
    console.print(f"all trials: {r.json_path}", highlight=False)
    if r.resume:
        console.print(f"[yellow]not finished:[/yellow] continue with: {r.resume}", highlight=False, soft_wrap=True)


RESULTS = ("verdict", "probe reward", "interval", "run steps", "proj. yuan", "probe yuan")
"""The trial table's columns after the knobs."""


def _print_trials(console: Console, r: SearchResult) -> None:
    """The trials: the legend of the knob columns p1..pN, then a row per trial with its knob values, verdict, reward
    and prices. Where the knob values do not fit beside the figures, the figures come first and the knob values in a
    second table under the same trial numbers."""
    keys = list(dict.fromkeys(k for row in r.trials for k in row["params"]))
    repeats = sum(row["duplicate_of"] is not None for row in r.trials)
    title = (f"study {r.study}: {len(r.trials)} trial(s)"
             + (f", {repeats} of them a repeat of an earlier one (not counted against --trials)" if repeats else "")
             + f", threshold {r.reward_threshold} ({metrics.reading_words(r.reward_metric, r.reward_window)}, "
             f"95% interval, each trial's own probe: the confirmation round's reward and "
             f"projected cost over its seeds are below and in the answer); full run: {_run(r.run)}; * answer, b baseline, r reference, =N same as trial N")
    knobs, results = [], []
    for row in r.trials:
        mark = "*" if r.best and row["number"] == r.best["number"] else ""
        mark += "b" if row["baseline"] else "r" if row.get("reference") else ""
        mark += f"={row['duplicate_of']}" if row["duplicate_of"] is not None else ""
        ci = row.get("reward_ci")
        knobs.append([f"{row['number']}{mark}", *[_short(row["params"].get(k, "·"), 10) for k in keys]])
        results.append([label(row), _yuan(row["reward"], 3), f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-",
                        str(row["projected_steps"] or "-"), _yuan(row["projected_yuan"], 3), _yuan(row["probe_yuan"], 2)])
    # knobs as p1..pN with a legend, so that one table fits an 80-column terminal
    legend = Columns([f"p{i + 1} {k}" for i, k in enumerate(keys)], padding=(0, 2))
    head = ["#", *[f"p{i + 1}" for i in range(len(keys))]]
    one = _trial_table(console, title, [*head, *RESULTS], [k + f for k, f in zip(knobs, results)])
    if natural_width(one, console) <= console.width:
        console.print(legend, highlight=False)
        console.print(one)
        return
    console.print(_trial_table(console, title, ["#", *RESULTS], [k[:1] + f for k, f in zip(knobs, results)]))
    console.print(legend, highlight=False)
    console.print(_trial_table(console, None, head, knobs))


def _trial_table(console: Console, title: str | None, headers: list[str], rows: list[list[str]]) -> Table:
    """A table of trials: the figures and the verdict never wrap, the knob values fold."""
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1))
    for h in headers:
        knob = h not in RESULTS and h != "#"
        t.add_column(h, justify="left" if knob or h == "verdict" else "right", no_wrap=not knob, overflow="fold")
    for row in rows:
        t.add_row(*row)
    return _fitted(t, console)


def _fitted(table: Table, console: Console) -> Table:
    """``table`` with every figure whole (:func:`whole_numbers`) and, where it is wider than the terminal, only the
    box's one space between columns, so that its text wraps less."""
    whole_numbers(table, console)
    if natural_width(table, console) > console.width:
        table.padding = 0
    return table


def _print_answer(console: Console, r: SearchResult) -> None:
    """The answer (:mod:`tunekit.search.answer`): the trial and how it reaches the threshold with which reward, its
    full run's price and saving, what the search cost and when the saving pays for it; then why."""
    style = {"confirmed": "bold green", "none": "bold red"}.get(r.verdict, "bold yellow")
    a = r.reaches
    lines = a.get("lines") or [r.answer]
    console.print(f"[{style}]answer:[/{style}] {lines[0]}", highlight=False)
    if r.best:
        console.print(f"full run: trial {r.best['number']}, projected {_cost(a.get('cost'), r.best)}", highlight=False)
    if r.saving_yuan is not None and r.baseline:
        pct = f" ({r.saving_pct:.1f}%)" if r.saving_pct is not None else ""
        held = f", {HOLDS}" if a.get("verdict") == "within noise" else ""
        console.print(f"saving vs baseline (trial {r.baseline['number']}, {_cost(a.get('baseline_cost'), r.baseline)}): "
                      f"{r.saving_yuan:.4g} yuan{pct}{held}", highlight=False)
    for line in lines[1:]:
        console.print(line, highlight=False)
    if r.best:  # a confirmation round's sentence opens with its verdict already
        console.print(f"why: {r.answer}" if r.answer.startswith(r.verdict) else f"why ({r.verdict}): {r.answer}",
                      highlight=False)


def _cost(quoted: dict[str, Any] | None, row: dict[str, Any]) -> str:
    """A full run's cost as the answer quotes it (:class:`tunekit.search.answer.Cost`), else the trial's own figure."""
    return quoted["text"] if quoted else f"{_yuan(row['projected_yuan'])} yuan"


def _run(run: dict[str, Any]) -> str:
    return "until the threshold" if run.get("until") == "threshold" else f"{run.get('samples')} samples"


def _print_confirmation(console: Console, c: dict[str, Any]) -> None:
    t = Table(title=f"confirmation round: seeds {', '.join(map(str, c['seeds']))}, alternating; cost = paired ratio of the "
                    "projected full run to the baseline's (95% interval); proj. yuan over the round's seeds", box=box.SIMPLE_HEAD, padding=(0, 1))
    for h in ("trial", "verdict", "reward (all seeds)", "run steps", "proj. yuan", "cost ratio", "noise interval", "step-time ratio"):
        t.add_column(h, justify="left" if h == "verdict" else "right")
    against_baseline = (c.get("paired") or {}).get(str(c.get("baseline"))) or {}  # a reference's too
    for cfg in c["configurations"]:
        ratios = c["ratios_vs_baseline"].get(str(cfg["trial"])) or against_baseline.get(str(cfg["trial"])) or {}
        noise = (ratios.get("cost") or {}).get("noise_ci")
        t.add_row(f"{cfg['trial']}{'b' if cfg['baseline'] else 'r' if cfg.get('reference') else ''}", cfg["verdict"],
                  f"{cfg['reward']:.3f} [{cfg['reward_ci'][0]:.3f}, {cfg['reward_ci'][1]:.3f}]", str(cfg["projected_steps"] or "-"),
                  _yuan(cfg.get("projected_yuan"), 3), _ratio(ratios.get("cost")), f"[{noise[0]:.3f}, {noise[1]:.3f}]" if noise else "-", _ratio(ratios.get("step_time")))
    console.print(whole_numbers(t, console))
    spread, two = c.get("round_spread"), c.get("top_two")
    if spread:
        console.print(f"paired cost ratios move {100 * spread['sd_log_ratio']:.1f}% (sd) from round to round ({spread['df']} df); "
                      "the noise interval is the ratio's Student's t interval from it", highlight=False)
    if two:
        console.print(f"top two: trial {two['trials'][0]} over trial {two['trials'][1]}: {_ratio(two)}, "
                      + ("told apart" if not two["within_noise"] else f"within noise ({two.get('why', '')})"), highlight=False)


def _ratio(r: dict[str, Any] | None) -> str:
    return "-" if not r else f"{r['ratio']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]"


def print_estimate(console: Console, est: Estimate) -> None:
    t = Table(title=f"projection of {est.recipe}'s full run ({est.run_rule}) from {len(est.runs)} earlier probe(s)",
              box=box.SIMPLE_HEAD, padding=(0, 1))
    hours = "GPU-h" if any(p.on_gpu for p in est.runs) else "CPU-h"  # what a device-hour is here
    for col in ("#", "profile", "probe steps", "run steps", "mean step s", "once s", "devices", "wall h", hours, "yuan"):
        t.add_column(col, justify="left" if col == "profile" else "right")
    for i, p in enumerate(est.runs):
        t.add_row(str(i + 1), p.profile, str(p.steps), str(p.run_steps), f"{p.mean_step_s:.4g}", f"{p.one_time_s:.3g}", str(p.gpus_held),
                  f"{p.wall_s / 3600:.4g}", f"{p.gpu_hours:.4g}", f"{p.yuan:.4g}")
    if len(est.runs) > 1:
        t.add_row("median", "", "", "", "", "", "", f"{est.wall_s / 3600:.4g}", f"{est.gpu_hours:.4g}", f"{est.yuan:.4g}")
    console.print(whole_numbers(t, console))
    for i, p in enumerate(est.runs):
        evals = f" (its wall time holds {p.evaluation_s:.4g} s of held-out evaluations)" if p.evaluation_s else ""
        console.print(f"{i + 1}: {p.run_dir}{evals}", highlight=False, soft_wrap=True)
    if any(p.profile != p.measured_on for p in est.runs):
        console.print("note: repriced with another profile; the step times are still those measured on the probe's hardware",
                      highlight=False)
    if est.skipped:
        console.print(f"{est.skipped} matching run(s) did not end ok and were left out", highlight=False)


def print_memory(console: Console, est: MemoryEstimate, profile: str | None) -> None:
    """The memory verdict: bytes per GPU by role, then each GPU's peak against the card."""
    def gib(v: float | None) -> str:
        return "unknown" if v is None else f"{v / GIB:.2f}"

    card = f"{profile} card" if profile else "unknown card (give --gpu-profile)"
    t = Table(title=f"estimated peak memory per GPU (GiB), {card}", box=box.SIMPLE_HEAD, padding=(0, 1))
    for col in ("role", "GPUs", "weights", "grads", "optimizer", "activations", "allocator slack", "engine", "total"):
        t.add_column(col, justify="left" if col in ("role", "GPUs") else "right", no_wrap=col not in ("role", "GPUs"))
    for r in est.roles:
        pool = gib(r.engine) + ("*" if r.engine_sleeps else "")
        slack = "-" if r.graphed else gib(r.slack)  # a CUDA graph's pool holds its activations exactly
        t.add_row(r.role, ", ".join(map(str, r.gpus)) or "-", gib(r.weights), gib(r.grads), gib(r.optimizer),
                  gib(r.activations), slack, pool, gib(r.total))
    console.print(_fitted(t, console))
    if any(r.engine_sleeps for r in est.roles):
        console.print("* the engine's pool, held only while it generates (it sleeps while training runs)", highlight=False)
    console.print("a GPU's peak is not the sum of its roles' totals: every role's weights, gradients and optimizer (and an "
                  "awake engine's pool) held at once, the CUDA graphs' one pool, and the largest of the parts the roles "
                  "hold only during their own phase, plus what lies outside the allocator", highlight=False, soft_wrap=True)
    for g in est.gpus:
        short = " (the engine's weight shard does not fit its pool)" if g.engine_short else ""
        console.print(f"GPU {g.gpu} ({', '.join(g.roles)}): peak {gib(g.peak)} of {gib(g.card)} GiB "
                      f"({gib(g.outside)} outside the allocator: CUDA contexts, engine graphs, NCCL): {g.verdict}{short}",
                      highlight=False)
