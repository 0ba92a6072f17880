"""Terminal tables of the cost model's estimate: one GPU type by phase, or several ranked by the full run's yuan."""

from __future__ import annotations

import re

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from tunekit.estimate.costmodel.predict import Prediction
from tunekit.estimate.memory import GIB


WIDE = 10_000
"""A width no table reaches: measuring against it gives a table's natural width."""
FIGURE = re.compile(r"[-+]?[0-9][0-9.,e+-]*[%*]?")


def natural_width(table: Table, console: Console) -> int:
    """The width ``table`` takes where nothing wraps."""
    return Measurement.get(console, console.options.update_width(WIDE), table).maximum


def whole_numbers(table: Table, console: Console) -> Table:
    """``table`` fitted to ``console`` with every figure whole: one space between columns, headers broken at their
    spaces when the table is wider than the terminal, and each column at least as wide as its widest figure (the
    headers and text wrap or shorten instead)."""
    table.collapse_padding = True
    if natural_width(table, console) > console.width:
        table.show_edge = table.pad_edge = False
        for col in table.columns:
            if isinstance(col.header, str):
                col.header = col.header.replace(" ", "\n")
    for col in table.columns:
        figures = [text for c in col.cells if FIGURE.fullmatch(text := (c.plain if isinstance(c, Text) else str(c)))]
        if figures:
            col.min_width = max(col.min_width or 0, *map(cell_len, figures))
    return table


def _h(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds / 3600:.4g}"


def _y(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}"


def calibration_word(p: Prediction) -> str:
    return f"calibrated from {p.probes} probe(s)" if p.calibrated else "uncalibrated"


def _launch_ms(x) -> str:
    """A block pass's host cost, and a model pass's after a plus where one was fitted."""
    if not x.launch_s:
        return "-"
    return f"{x.launch_s * 1e3:.3g}" + (f" + {x.pass_s * 1e3:.3g}" if x.pass_s else "")


TERMS_SHOWN = 3
"""Terms a phase's row names, largest first."""


def set_by(x) -> str:
    """Which side bounds the phase and its largest terms in seconds, e.g. ``host: sequences in flight 0.52, ...``."""
    if not x.terms:
        return "-"
    shown = ", ".join(f"{name} {seconds:.2g}" for name, seconds in x.terms[:TERMS_SHOWN])
    return f"{x.bound}: {shown}" if x.bound else shown


def print_prediction(console: Console, p: Prediction) -> None:
    """Per-phase seconds with the efficiency behind each and the terms that set them, the step, the full run, and
    what was assumed."""
    t = Table(title=f"cost model: a step of {p.recipe} on {p.gpus} x {p.profile} ({calibration_word(p)})",
              box=box.SIMPLE_HEAD, padding=(0, 1))
    for col in ("phase", "s", "low s", "efficiency", "launch ms", "set by (s)", "from"):
        t.add_column(col, justify="left" if col in ("phase", "set by (s)", "from") else "right")
    for x in p.phases:
        src = (f"{x.probes} probe(s)" + ("" if x.seen else ", launch-bound: default efficiency")) if x.probes else "default"
        if x.borrowed:
            src = f"{x.fitted_on}'s fit, {src}"
        t.add_row(x.name, f"{x.seconds:.4g}", f"{x.low_s:.4g}", f"{x.efficiency:.3g}" if x.divided else "-",
                  _launch_ms(x), set_by(x), f"{x.group}: {src}" if x.divided else "stated")
    if p.other_s:
        t.add_row("other", f"{p.other_s:.4g}", f"{p.other_s:.4g}", "-", "-", "-", "outside the phases, per sample")
    t.add_row("step", f"{p.step_s:.4g}", f"{p.step_low_s:.4g}", "", "", "", "")
    console.print(whole_numbers(t, console))
    if p.run.steps is None:
        console.print(f"full run: unknown ({p.run.rule})", highlight=False)
    else:
        console.print(f"full run: {p.run.steps} steps ({p.run.rule}), start-up {p.startup_s:.3g} s: {_h(p.wall_s)} h on "
                      f"{p.gpus} GPU(s), {_y(p.yuan)} yuan (low bound {_y(p.yuan_low)})", highlight=False)
    for line in p.assumptions:
        console.print(f"assumed: {line}", highlight=False, soft_wrap=True)


def print_comparison(console: Console, preds: list[Prediction]) -> None:
    """GPU types ranked by the full run's yuan (a layout that would not fit last)."""
    first = preds[0]
    t = Table(title=f"cost model: {first.recipe} on {first.gpus} GPU(s) of each type, cheapest full run first "
                    f"({calibration_word(first)}; {first.run.rule})", box=box.SIMPLE_HEAD, padding=(0, 1))
    for col in ("#", "profile", "step s", "gen s", "update s", "wall h", "yuan", "low yuan", "peak GiB", "memory"):
        t.add_column(col, justify="left" if col in ("profile", "memory") else "right")
    for i, p in enumerate(preds):
        by = {x.name: x.seconds for x in p.phases}
        update = sum(v for k, v in by.items() if k.startswith("update_") and k != "update_weights")
        peak = p.memory.peak
        card = p.memory.gpus[0].card if p.memory.gpus else None
        t.add_row(str(i + 1), p.profile, f"{p.step_s:.4g}", f"{by.get('gen', 0.0):.4g}", f"{update:.4g}", _h(p.wall_s),
                  _y(p.yuan), _y(p.yuan_low), "unknown" if peak is None else f"{peak / GIB:.1f} of {card / GIB:.0f}" if card else f"{peak / GIB:.1f}",
                  p.memory.verdict)
    console.print(whole_numbers(t, console))
    if any(line not in first.assumptions for p in preds[1:] for line in p.assumptions):
        console.print(f"assumed for {first.profile} (the first row):", highlight=False)
    for line in first.assumptions:
        console.print(f"assumed: {line}", highlight=False, soft_wrap=True)
    for p in preds[1:]:  # where a profile was priced otherwise (its card left out the CUDA graphs, say)
        for line in p.assumptions:
            if line not in first.assumptions:
                console.print(f"assumed for {p.profile}: {line}", highlight=False, soft_wrap=True)
    if first.calibrated:
        console.print("assumed: an efficiency is a share of each GPU's own peak, carried over from the probes' GPU; launch "
                      "costs are host-bound and carried over unchanged", highlight=False, soft_wrap=True)
