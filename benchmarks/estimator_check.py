"""The cost model against measurement: calibrate on short probes of one shape, predict another, then probe it.

    PYTHONPATH=. python3 benchmarks/estimator_check.py --out "$OUT"                 # one H200, up to the 540 s budget
    PYTHONPATH=. python3 benchmarks/estimator_check.py --out "$OUT" --targets 3b    # calibration, then the 3B target only
    PYTHONPATH=. python3 benchmarks/estimator_check.py --out "$OUT" --predict-2gpu  # also the 2-GPU layout (x2 machine)
    PYTHONPATH=. python3 benchmarks/estimator_check.py --out "$OUT" --from-runs DIR # from run directories, no probe
    PYTHONPATH=. python3 benchmarks/estimator_check.py --out "$OUT" --cpu           # the same on CPU, tiny shapes

GPU: PPO, HF rollout, 64 fixed new tokens, one GPU, eager (``system.compile=false``). Calibration: the Qwen2.5-0.5B
preset at two batch settings (prompts x micro-batch 32 x 8 and 64 x 32: the update's work per launch differs 4x), the
embedded tiny model (its decode is almost all launch cost, which separates the per-block launch cost from the
bandwidth efficiency), and the 0.5B preset at 64 x 64 with 256 new tokens (an update bound by its work, not by the
host's launches, so an efficiency is seen).
Targets: the Qwen2.5-1.5B preset at 64 x 16 (launch-bound) and at 64 x 32 with 256 new tokens (work-bound; at 64 x
64 the memory verdict says 150 GiB, over the card, and the probe ran out of memory), each predicted per phase and in
peak memory before it runs, then probed. The Qwen2.5-3B preset under GRPO with a KL reference (actor + reference, no
critic: PPO's three models would not fit), 32 prompts x 4 samples, micro-batch 64 (two micro-batches, each bound by
its work, not the host's launches), estimated at 101 GiB of the card; ``--targets 3b`` runs it alone after the
calibration (about 6 minutes in all), so the check fits one 10-minute call.
CPU (``--cpu``): the embedded model at two batch settings calibrates, the ``tiny-arith-4l`` preset is the target,
priced on a nominal CPU card written to ``OUT/cpu-nominal.yaml`` (its peaks only scale the efficiencies).

Writes ``OUT/estimator_check.json`` (one compact table for benchmarks/collect.py): the fitted efficiencies, per
target phase the predicted and measured steady median seconds and error = (predicted - measured) / measured, the
predicted peak GiB against NVML's and the allocator's peaks, and the model's A100/H100-to-H200 time ratios.
``--from-runs DIR``: run directories under DIR of the target's preset are the targets, all others calibrate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

ALL1 = "{actor: [0], critic: [0], ref: [0], rollout: [0], reward: [0]}"
ALL2 = "{actor: [0,1], critic: [0,1], ref: [0,1], rollout: [0,1], reward: [0,1]}"
# eager on every side: a compiled 6-step PPO probe of the 0.5B preset did not finish its first step within 300 s on an
# H200 (the actor, critic and reference each compile their passes), more than a calibration can spend per probe
COMMON = ["probe.steps={steps}", "probe.warmup_steps=2", "probe.timeout_s={timeout}", "profiler.comm_steps=0", "system.compile=false",
          "task.max_new_tokens=64", "task.fixed_length=true"]
# micro-batch 64 of 256 new tokens: enough work per block pass (about 16k tokens) that the update is bound by its work
# and not by the host's launches, so the calibration sees an efficiency and the second target tests it
WORK = ["system.batch.prompts_per_step=64", "system.batch.micro_batch_size=64", "task.max_new_tokens=256"]
GPU = {"calib": [("0.5b-p32-m8", "qwen2.5-0.5b", ["system.batch.prompts_per_step=32", "system.batch.micro_batch_size=8"]),
                 ("0.5b-p64-m32", "qwen2.5-0.5b", ["system.batch.prompts_per_step=64", "system.batch.micro_batch_size=32"]),
                 ("tiny-p64-m16", None, ["system.device=cuda", "system.batch.prompts_per_step=64", "system.batch.micro_batch_size=16"]),
                 ("0.5b-p64-m64-t256", "qwen2.5-0.5b", WORK)],
       "targets": [("1.5b-p64-m16", "qwen2.5-1.5b", ["system.batch.prompts_per_step=64", "system.batch.micro_batch_size=16"]),
                   ("1.5b-p64-m32-t256", "qwen2.5-1.5b", ["system.batch.prompts_per_step=64", "system.batch.micro_batch_size=32",
                                                              "task.max_new_tokens=256"]),
                   ("3b-grpo-p32x4-m64", "qwen2.5-1.5b", ["model.preset=qwen2.5-3b", "algorithm.name=grpo", "algorithm.kl_coef=0.001",
                                                          "system.batch.prompts_per_step=32", "system.batch.samples_per_prompt=4",
                                                          "system.batch.micro_batch_size=64"])]}
CPU = {"calib": [("tiny-p16-m8", None, ["system.batch.prompts_per_step=16", "system.batch.micro_batch_size=8", "task.max_new_tokens=8"]),
                 ("tiny-p32-m32", None, ["system.batch.prompts_per_step=32", "system.batch.micro_batch_size=32", "task.max_new_tokens=8"])],
       "targets": [("tiny4l-p32-m16", None, ["model.preset=tiny-arith-4l", "system.batch.prompts_per_step=32",
                                              "system.batch.micro_batch_size=16", "task.max_new_tokens=8"])]}
CPU_CARD = {"name": "cpu-nominal", "nvml_pattern": None, "memory_gib": 16, "peak_bf16_tflops": 0.2, "yuan_per_gpu_hour": 0.5,
            "price_source": "Estimate: a nominal CPU card for checking the cost model on CPU.", "price_date": None,
            "peak_source": "Nominal: the efficiencies fitted on it absorb the real peak.", "hbm_bandwidth_gbs": 20,
            "interconnect_gbs": 5, "host_link_gbs": 20, "bandwidth_source": "Nominal, as the peak."}
COMPARE = ("a100-80g", "h100-80g")


def chosen_targets(targets: list[tuple], spec: str) -> list[tuple]:
    """The targets whose label starts with one of ``spec``'s comma-separated prefixes (``all``: every one)."""
    if spec == "all":
        return list(targets)
    prefixes = [p.strip() for p in spec.split(",") if p.strip()]
    return [t for t in targets if any(t[0].startswith(p) for p in prefixes)]


def error(pred: float | None, meas: float | None) -> float | None:
    """(predicted - measured) / measured; None when either is missing."""
    return None if pred is None or not meas else (pred - meas) / meas


def compare_run(pred, summary: dict) -> dict:
    """Predicted vs measured per phase, step and peak memory of one probe's summary."""
    from tunekit.estimate.memory import GIB

    steady = summary.get("steady", {})
    rows = {}
    for p in pred.phases:
        meas = steady.get(f"timing_s/{p.name}")
        rows[p.name] = {"pred_s": round(p.seconds, 4), "meas_s": meas, "err": _r(error(p.seconds, meas)), "eff": round(p.efficiency, 4)}
    step = steady.get("timing_s/step")
    nvml = [float(v) for k, v in summary.items() if k.startswith("nvml/mem_used_gb/") and isinstance(v, (int, float))]
    peak = None if pred.memory.peak is None else pred.memory.peak / GIB
    reserved = steady.get("perf/max_memory_reserved_gb")
    return {"status": summary.get("status"), "phases": rows,
            "step": {"pred_s": round(pred.step_s, 4), "low_s": round(pred.step_low_s, 4), "meas_s": step, "err": _r(error(pred.step_s, step))},
            "memory_gib": {"pred": _r(peak), "nvml_peak": max(nvml) if nvml else None, "err_vs_nvml": _r(error(peak, max(nvml) if nvml else None)),
                           "reserved_peak": reserved, "err_vs_reserved": _r(error(peak, reserved))}}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def ratios(recipe, cal, base: str) -> dict:
    """The model's time on each compared GPU type over its time on ``base``, for decode (gen) and the actor's update:
    calibrated (the fitted launch costs carried over unchanged) and from the datasheet peaks alone."""
    from tunekit.estimate.costmodel import predict
    from tunekit.runners import runner_for
    from tunekit.estimate.profiles import load_profile

    out = {}
    for kind, c in (("calibrated", cal), ("uncalibrated", None)):
        seconds = lambda name: {p.name: p.seconds for p in predict(recipe, load_profile(name), c,  # noqa: E731
                                                                   runners=runner_for).phases}
        ref = seconds(base)
        for name in COMPARE:
            other = seconds(name)
            out[f"{name}/{base} {kind}"] = {ph: round(other[ph] / ref[ph], 3) for ph in ("gen", "update_actor") if ref.get(ph)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on CPU (a check that the script runs)")
    ap.add_argument("--predict-2gpu", action="store_true", help="also predict the target on 2 GPUs (probed when 2 are visible)")
    ap.add_argument("--from-runs", type=Path, help="compare from run directories under DIR; no probe runs")
    ap.add_argument("--steps", type=int, default=6, help="steps per probe (2 are warm-up)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all probes; no probe starts once spent")
    ap.add_argument("--keep", type=float, default=200.0, help="seconds of the budget the calibration leaves to the targets")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override added to every probe")
    ap.add_argument("--targets", default="all", help="comma-separated label prefixes of the targets to predict and probe "
                                                     "(GPU: 1.5b, 3b); all: every one")
    args = ap.parse_args()

    import torch

    from tunekit.config import load_recipe
    from tunekit.estimate.costmodel import calibrate, predict
    from tunekit.runners import runner_for
    from tunekit.config.errors import TunekitError
    from tunekit.launch.probe import run_probe
    from tunekit.estimate.memory import GIB
    from tunekit.estimate.profiles import load_profile
    from tunekit.rundir import find_configs, read_config, read_summary

    if not args.cpu and not args.from_runs and not torch.cuda.is_available():
        print("estimator_check: needs an NVIDIA GPU (or --cpu, or --from-runs DIR); run it on the H200 machine.", file=sys.stderr)
        return 2
    suite = CPU if args.cpu else GPU
    chosen = chosen_targets(suite["targets"], args.targets)
    if not chosen:
        print(f"estimator_check: --targets {args.targets}: no target label starts with it; the labels are "
              f"{', '.join(t[0] for t in suite['targets'])}.", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    card, card_path = None, None
    if args.cpu:
        import yaml

        card_path = args.out / "cpu-nominal.yaml"
        card_path.write_text(yaml.safe_dump(CPU_CARD))
        card = load_profile(str(card_path))
    t0 = time.monotonic()
    meta = {"date": time.strftime("%Y-%m-%d"), "device": "cpu" if args.cpu else torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-",
            "command": "PYTHONPATH=. python3 benchmarks/estimator_check.py --out $OUT" + " --cpu" * args.cpu
                       + " --predict-2gpu" * args.predict_2gpu + (f" --from-runs {args.from_runs}" if args.from_runs else "")
                       + (f" --targets {args.targets}" if args.targets != "all" else ""),
            "common": COMMON, "steps": args.steps}
    report: dict = {"meta": meta}

    def probe(label: str, recipe_ref: str | None, extra: list[str], keep_s: float = 0.0) -> dict:
        """One probe; none once less than ``keep_s`` (what the target needs) + 30 s of the budget is left."""
        left = args.budget - (time.monotonic() - t0)
        if left < keep_s + 30:
            return {"status": "skipped", "reason": f"budget ({args.budget:g} s) spent"}
        common = [c.format(steps=args.steps, timeout=min(300, left - 5)) for c in COMMON] + [f"system.device_map={ALL1}"]
        r = load_recipe(recipe_ref, common + extra + args.set)
        res = run_probe(r, out=args.out / "runs", run_id=f"{label}-{time.strftime('%H%M%S')}",
                        gpu_profile=str(card_path) if card_path else None)
        print(f"[{time.monotonic() - t0:5.0f}s] {label}: {res.status} step={res.summary.get('steady', {}).get('timing_s/step')} "
              f"{str(res.summary.get('reason', ''))[:200]}", flush=True)
        return res.summary | {"run_dir": str(res.run_dir)}

    common = [c.format(steps=args.steps, timeout=300) for c in COMMON] + [f"system.device_map={ALL1}"]
    shapes = {label: (ref, extra, load_recipe(ref, common + extra + args.set)) for label, ref, extra in chosen}
    t_label = chosen[0][0]
    target = shapes[t_label][2]
    if args.from_runs:
        targets, calib_dirs = {}, []
        for cfg in find_configs(args.from_runs):
            try:
                run = read_config(cfg.parent)
            except TunekitError as e:
                print(f"left out: {e.message}", file=sys.stderr)
                continue
            if run.model.preset == target.model.preset:
                targets[cfg.parent.name] = (run, read_summary(cfg.parent) or {})
            else:
                calib_dirs.append(cfg.parent)
        cal = calibrate(calib_dirs, runners=runner_for, measured_on=card)
    else:
        calib_dirs = []
        for label, ref, extra in suite["calib"]:
            summary = probe(label, ref, extra, keep_s=args.keep)
            report.setdefault("calibration_probes", {})[label] = summary.get("status")
            calib_dirs += [Path(summary["run_dir"])] if summary.get("status") == "ok" else []
        cal = calibrate(calib_dirs, runners=runner_for, measured_on=card)
        targets = {}
    report["calibration"] = {g: {"eff": _r(f.efficiency), "launch_ms": _r(f.launch_s * 1e3), "pass_ms": _r(f.pass_s * 1e3), "low": _r(f.low), "high": _r(f.high),
                                 "probes": f.probes} for g, f in cal.fits.items()}
    report["calibration_n"] = cal.n
    base = card or load_profile("h200")
    layouts = {label: r for label, (_, _, r) in shapes.items()}
    if args.predict_2gpu:
        layouts[t_label + "-2gpu"] = target.model_copy(update={"system": target.system.model_copy(update={
            "device_map": {r: [0, 1] for r in target.system.device_map}})})
    predictions = {label: predict(r, base, cal, runners=runner_for)
                   for label, r in layouts.items()}  # before the target runs
    report["predicted_before_probe"] = {label: {"step_s": round(p.step_s, 4), "phases": {x.name: round(x.seconds, 4) for x in p.phases},
                                                "memory_gib": _r(None if p.memory.peak is None else p.memory.peak / GIB)}
                                        for label, p in predictions.items()}
    (args.out / "estimator_check.json").write_text(json.dumps(report, separators=(",", ":"), default=str))
    print("predicted before any target probe:", json.dumps(report["predicted_before_probe"], indent=1), flush=True)
    report["targets"] = {}
    if args.from_runs:
        for name, (run, summary) in targets.items():
            report["targets"][name] = compare_run(predict(run, base, cal, runners=runner_for),
                                                  summary)
    else:
        for label, r in layouts.items():
            if label.endswith("-2gpu") and torch.cuda.device_count() < 2:
                report["targets"][label] = {"status": "predicted only: fewer than 2 GPUs visible"}
                continue
            ref, extra, _ = shapes[label.removesuffix("-2gpu")]
            summary = probe(label, ref, extra + ([f"system.device_map={ALL2}"] if label.endswith("-2gpu") else []))
            report["targets"][label] = compare_run(predictions[label], summary)
    if not args.cpu:
        report["gpu_ratios"] = ratios(target, cal, "h200")
    meta["total_s"] = round(time.monotonic() - t0, 1)
    text = json.dumps(report, separators=(",", ":"), default=str)
    (args.out / "estimator_check.json").write_text(text)
    print(json.dumps(report, indent=1, default=str))
    ok = [t for t in report["targets"].values() if t.get("status") == "ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
