"""Tables for benchmarks/README.md from the result files under benchmark output directories (e.g. ``side_by_side.py --out``).

    python3 benchmarks/gpu_tables.py DIR...

Reads every ``<suite>.json`` (benchmarks/matrix.py) and ``rollout_backends.json`` under the
directories and prints one markdown section per suite, with the derived figures the results page
quotes: update-phase scaling 1 → 2 GPUs, profiler overhead, MFU, projection error, growth.
Pure arithmetic on what the probes recorded; nothing here measures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rollout_backends import fmt as f, markdown  # this folder is on sys.path when a script here runs


def load(dirs: list[Path], name: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for d in dirs:
        for p in sorted(d.rglob(f"{name}.json")):
            # each probe's records sit in runs/<label> beside the table
            out |= {label: s | {"_run": str(p.parent / "runs" / label)} for label, s in json.loads(p.read_text()).items()}
    return out


def steady(s: dict, key: str) -> float | None:
    return (s.get("steady") or {}).get(key)


def peak_reserved(s: dict) -> float | None:
    """Largest per-step allocator reserved peak of the probe (GiB), from its step records when present."""
    run = s.get("_run")
    if run and Path(run, "steps.parquet").exists():
        import pandas as pd

        df = pd.read_parquet(Path(run, "steps.parquet"))
        if "perf/max_memory_reserved_gb" in df:
            return float(df["perf/max_memory_reserved_gb"].max())
    return steady(s, "perf/max_memory_reserved_gb")


def nvml_peak(s: dict) -> str:
    vals = {k.rsplit("/", 1)[1]: v for k, v in s.items() if k.startswith("nvml/mem_used_gb/") and v is not None}
    return " / ".join(f"{g}: {v:.1f}" for g, v in sorted(vals.items())) or "-"


def phases_table(rows: dict[str, dict]) -> list[str]:
    cols = ["step", "gen", "ref", "old_logprob", "values", "update_critic", "update_actor", "update_weights"]
    out = ["| config | status | " + " | ".join(f"{c} s" for c in cols) + " | reserved peak GiB | NVML GiB per GPU | "
           "tokens/s/GPU | MFU actor | MFU critic |", "|" + "---|" * (len(cols) + 7)]
    for label, s in rows.items():
        out.append(f"| {label} | {s.get('status')} | " + " | ".join(f(steady(s, f'timing_s/{c}')) for c in cols)
                   + f" | {f(peak_reserved(s))} | {nvml_peak(s)} | {f(s.get('perf/throughput'), '.0f')} | "
                   f"{f(s.get('perf/mfu/actor'), '.1%')} | {f(s.get('perf/mfu/critic'), '.1%')} |")
    return out


def gpu15(rows: dict[str, dict]) -> list[str]:
    out = ["### 1.5B: 1 vs 2 GPUs, profiler on vs minimal, MFU", ""] + phases_table(rows)
    one, two, low = rows.get("1.5b-spmd1"), rows.get("1.5b-spmd2"), rows.get("1.5b-spmd1-profiler-min")
    if one and two:
        for ph in ("update_actor", "update_critic", "step"):
            a, b = steady(one, f"timing_s/{ph}"), steady(two, f"timing_s/{ph}")
            if a and b:
                out.append(f"\n- scaling 1 → 2 GPUs, {ph}: {a:.3g} s → {b:.3g} s, efficiency {a / (2 * b):.1%} (t1 / (2 t2))")
    if one and low:
        a, b = steady(one, "timing_s/step"), steady(low, "timing_s/step")
        if a and b:
            out.append(f"- profiler fully on vs minimal: step {a:.4g} s vs {b:.4g} s, overhead {a / b - 1:+.1%}")
    return out


def fidelity(rows: dict[str, dict]) -> list[str]:
    out = ["### Projection fidelity: 100-step probe → 500-step run", "",
           "| config | probe median step s | projected 500-step yuan | run 500 steps wall s | run yuan (measured) | error |",
           "|---|---|---|---|---|---|"]
    for label in sorted(k.removesuffix("-probe100") for k in rows if k.endswith("-probe100")):
        p, r = rows.get(f"{label}-probe100"), rows.get(f"{label}-run500")
        if not p or not r:
            continue
        proj, real = p.get("cost/projected_yuan"), r.get("cost/probe_yuan")
        err = f"{proj / real - 1:+.1%}" if proj and real else "-"
        out.append(f"| {label} | {f(steady(p, 'timing_s/step'))} | {f(proj, '.4f')} | {f(r.get('wall_s'), '.1f')} | "
                   f"{f(real, '.4f')} | {err} |")
    return out


def growth(rows: dict[str, dict]) -> list[str]:
    out = ["### Cost growth as the work doubles", "", "| config | step s | gen s | update_actor s | reserved peak GiB | "
           "tokens/s/GPU |", "|---|---|---|---|---|---|"]
    for label, s in sorted(rows.items(), key=lambda kv: (kv[0].rstrip("0123456789"), int("0" + "".join(c for c in kv[0] if c.isdigit())))):
        out.append(f"| {label} | {f(steady(s, 'timing_s/step'))} | {f(steady(s, 'timing_s/gen'))} | "
                   f"{f(steady(s, 'timing_s/update_actor'))} | {f(peak_reserved(s))} | {f(s.get('perf/throughput'), '.0f')} |")
    return out


def rollout(dirs: list[Path]) -> str:
    """rollout_backends.py's own table over the rows of every directory (the first one's header)."""
    found = [json.loads(p.read_text()) for d in dirs for p in sorted(d.rglob("rollout_backends.json"))]
    if not found:
        return ""
    rows = {name: r for data in found for name, r in data["rows"].items()}
    return markdown(rows, found[0]["meta"] | {"command": "see benchmarks/README.md (one GPU group per row group)"})


def main() -> int:
    dirs = [Path(a) for a in sys.argv[1:]]
    sections = {"gpu15": gpu15, "fidelity": fidelity, "growth": growth,
                "controllers": lambda rows: ["### Controllers and device maps", ""] + phases_table(rows)}
    for suite, make in sections.items():
        rows = load(dirs, suite)
        if rows:
            print("\n".join(make(rows)) + "\n")
            for label, s in rows.items():
                if s.get("status") != "ok":
                    print(f"- {label}: {s.get('status')}: {str(s.get('reason'))[:300]}")
    print(rollout(dirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
