#!/usr/bin/env bash
# TRL at its best against tunekit's default, one after the other on one GPU, then the in-probe actor update at 1.5B.
#
# The workload of both: the Qwen2.5-0.5B preset, GRPO, 64 prompts x 4 samples x 128 new tokens (fixed length),
# micro-batch 16, one optimizer step a step, vLLM colocated (sleep, util 0.35) with decode CUDA graphs in both
# engines (--engine graphs). TRL 1.16: torch_compile=True; vllm_importance_sampling_correction=False, as tunekit,
# whose on-policy update has no importance-sampling correction (no extra forward for old logprobs on either
# side); gradient checkpointing off; bf16 autocast over fp32 weights (tunekit: bf16 weights over fp32 masters); Liger kernels when
# liger_kernel is importable (recorded in the table's meta either way). tunekit: the recipe's defaults, so
# system.compile, system.cuda_graphs and system.memory.fsdp_single_gpu / master_weights at auto (the table says what
# they resolved to).
# Each table gives the steady step time apart from the warm-up steps' extra time (compilation, first runs).
# Then benchmarks/update_bench.py --probe-shape: the 1.5B actor's update as a probe runs it, default and FSDP2 eager.
#
#   bash benchmarks/fast_pair.sh OUT [--dry-run]      # needs vllm and trl importable; about 7 minutes on an H200
#
# Writes OUT/plan.txt, OUT/trl_grpo_graphs.{json,md}, OUT/trl_raw_graphs.json, OUT/trl_log_graphs.txt, OUT/runs/,
# OUT/update_probe-qwen2.5-1.5b.{json,md}, OUT/*.log. The whole run stays under BUDGET_S (default 470) seconds.
set -uo pipefail
out=$(realpath -m "${1:?usage: fast_pair.sh OUT [--dry-run]}")
dry=${2:-}
budget=${BUDGET_S:-470}
cd "$(dirname "$0")/.."
mkdir -p "$out"
pair=(python3 benchmarks/trl_grpo.py --mode both --engine graphs --steps 8 --warmup 3 --timeout 280
      --trl-compile --trl-is-correction off --trl-liger --out "$out")
mfu=(python3 benchmarks/update_bench.py --probe-shape --preset qwen2.5-1.5b --reps 3 --set probe.warmup_steps=2 --out "$out")
printf '%s\n' "${pair[*]}" "${mfu[*]}" | tee "$out/plan.txt"
[ "$dry" = "--dry-run" ] && exit 0
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
"${pair[@]}" 2>&1 | tee "$out/pair.log"
left=$((budget - SECONDS))
if [ "$left" -gt 30 ]; then
  timeout "$left" "${mfu[@]}" 2>&1 | tee "$out/update_probe.log"
else
  echo "fast_pair: no time left for the 1.5B update ($left s of $budget)" | tee "$out/update_probe.log"
fi
echo "fast_pair: $SECONDS s"
