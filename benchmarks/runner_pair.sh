#!/usr/bin/env bash
# One workload, two runners, one GPU: tunekit's own trainer, then TRL's GRPOTrainer, each probed by `tunekit probe`
# with the same recipe: the Qwen2.5-0.5B preset, GRPO, 64 prompts x 4 samples x 128 new tokens (fixed length),
# micro-batch 16, vLLM colocated with sleep and CUDA graphs (vLLM's default torch.compile + graphs: the engine TRL's
# colocated mode runs, given to both), the plain module on the GPU (as TRL runs one GPU), no communication sampling
# (TRL's collectives are not profiled). Both write the same records, so the report lays them side by side:
# step time by phase, memory, tokens/s/GPU. RUNNERS="builtin trl verl" adds verl's own PPO entry point on the same
# workload; verl has one controller (Ray, system.controller=single) and trains under FSDP even on one GPU, so its
# row differs from the others there (the report's configuration table shows it).
#
#   bash benchmarks/runner_pair.sh OUT [STEPS]      # needs vllm and trl importable (pip install -e ".[vllm,trl]")
#   RUNNERS="builtin trl verl" bash benchmarks/runner_pair.sh OUT 20   # also verl (pip install -e ".[vllm,verl]")
#   PROBE_TIMEOUT_S=500 ...                                            # each probe's limit (default 900 s)
set -uo pipefail
out=$(realpath -m "${1:?usage: runner_pair.sh OUT [STEPS]}")
steps=${2:-12}
mkdir -p "$out"
cd "$(dirname "$0")/.."
args=(--recipe qwen2.5-0.5b --steps "$steps" --out "$out/runs"
      --set algorithm.name=grpo --set system.batch.samples_per_prompt=4
      --set system.rollout.backend=vllm --set system.rollout.enforce_eager=false --set system.rollout.torch_compile=true
      --set system.memory.fsdp_single_gpu=false --set profiler.comm_steps=0 --set probe.warmup_steps=3
      --set probe.timeout_s="${PROBE_TIMEOUT_S:-900}")
for runner in ${RUNNERS:-builtin trl}; do
  extra=()
  [ "$runner" = verl ] && extra=(--set system.controller=single --set system.memory.fsdp_single_gpu=true)
  python3 -m tunekit probe --runner "$runner" "${args[@]}" "${extra[@]}" 2>&1 | tee "$out/probe-$runner.txt"
done
python3 -m tunekit report "$out/runs" -o "$out/runner_pair.html"
python3 benchmarks/runner_rows.py "$out/runs" --out "$out" --warmup 3   # the comparison table: runner_rows.json
