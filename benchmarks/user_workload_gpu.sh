#!/usr/bin/env bash
# A user's workload under every runner on one GPU: a Parquet file with a data_source column and a reward written in
# verl's style (keyword-only parameters, a dict return). Each runner must hand the reward the row's data_source and
# extra_info (its other columns with index and split) as verl does, keep the dict's other key as reward/extra/right
# (builtin, trl), and end a probe whose reward turns NaN mid-run as status failed with the sentence naming
# task.reward (verl: read from its workers' output). Prints one line per check; exit 1 when one fails.
#
#   bash benchmarks/user_workload_gpu.sh OUT          # vllm and trl importable; RUNNERS="builtin trl verl" adds verl
set -uo pipefail
out=$(realpath -m "${1:?usage: user_workload_gpu.sh OUT}")
mkdir -p "$out" && cd "$out"
python3 - <<'PY'
import random, pandas as pd
rng = random.Random(0)
rows = [(rng.randint(0, 20), rng.randint(0, 20), i) for i in range(400)]
pd.DataFrame({"prompt": [f"{a}+{b}=" for a, b, _ in rows], "answer": [str(a + b) for a, b, _ in rows],
              "data_source": [f"src{i % 3}" for *_, i in rows], "level": [i % 2 for *_, i in rows]}).to_parquet("rows.parquet")
open("gpu_reward.py", "w").write('''
import json, math, os
from pathlib import Path
def compute_score(*, data_source, solution_str, ground_truth, extra_info):
    assert all(isinstance(v, str) for v in (data_source, solution_str, ground_truth)), "not strings"
    with (Path(__file__).parent / "calls.jsonl").open("a") as f:
        f.write(json.dumps({"src": data_source, "level": extra_info.get("level"), "index": extra_info.get("index"),
                            "split": extra_info.get("split")}) + "\\n")
    if os.environ.get("GPU_REWARD_NAN") and os.environ.get("TUNEKIT_RUN_DIR"):
        return math.nan
    right = float(solution_str.strip() == ground_truth)
    return {"score": 0.25 + 0.75 * right, "right": right}
''')
PY
export PYTHONPATH="$out${PYTHONPATH:+:$PYTHONPATH}"
args=(--recipe qwen2.5-0.5b --steps 4 --set algorithm.name=grpo --set system.batch.samples_per_prompt=4
      --set task.dataset="$out/rows.parquet" --set task.reward=gpu_reward:compute_score --set system.rollout.backend=vllm
      --set probe.timeout_s=900)
verl=(--set system.controller=single --set system.memory.fsdp_single_gpu=true)
status=0
for runner in ${RUNNERS:-builtin trl}; do
  extra=(); [ "$runner" = verl ] && extra=("${verl[@]}")
  rm -f calls.jsonl
  python3 -m tunekit probe --runner "$runner" --out "runs-$runner" "${args[@]}" "${extra[@]}" > "probe-$runner.txt" 2>&1
  GPU_REWARD_NAN=1 python3 -m tunekit probe --runner "$runner" --out "nan-$runner" "${args[@]}" "${extra[@]}" > "nan-$runner.txt" 2>&1
  python3 - "$runner" <<'PY' || status=1
import json, sys, glob, pandas as pd
runner = sys.argv[1]
(run,) = glob.glob(f"runs-{runner}/*/"); (nan,) = glob.glob(f"nan-{runner}/*/")
summary, steps = json.load(open(run + "summary.json")), pd.read_parquet(run + "steps.parquet")
rows = pd.read_parquet("rows.parquet")
calls = [json.loads(l) for l in open("calls.jsonl")]
checks = {
    "probe ok": summary["status"] == "ok",
    "data_source and extra_info are the row's": all(c["src"] == rows.data_source[c["index"]] and c["level"] == rows.level[c["index"]] for c in calls),
    "reward/extra/right recorded": runner == "verl" or ("reward/extra/right" in steps and steps["reward/extra/right"].notna().all()),
    "NaN mid-run: failed with the sentence": (lambda s: s["status"] == "failed" and s["reason"].startswith("task.reward 'gpu_reward:compute_score' returned nan"))(json.load(open(nan + "summary.json"))),
}
for name, ok in checks.items():
    print(f"{runner:8s} {'ok ' if ok else 'FAIL'} {name}")
sys.exit(0 if all(checks.values()) else 1)
PY
done
exit $status
