#!/usr/bin/env bash
# On an air-gapped GPU host, once the bundle is installed (scripts/gpu_bundle.sh, install.sh):
# measure a fixed list of configs with `tuner bench`, one engine launch each, in order, so the
# replay's predictions can be checked against configs no fit has seen (benchmarks/).
#
#   scripts/gpu_bench.sh LIST [BUDGET_S]     (default 540 seconds)
#
# LIST: one launch per line, `NAME|SPEC_JSON|ENGINE_ARGS|ENGINE_ENV` (SPEC_JSON `none` for a
# baseline; ENGINE_ENV space-separated NAME=VALUE; # starts a comment). Resumable: results live
# in WORK/NAME (default WORK=~/spec-tuner-gpu/bench, outside the checkout and OUT) and a launch
# with a result.json is not run again, so the same command continues where the last run stopped.
# A launch starts only when TRIAL_S (default 150) is left; everything measured so far is packed
# into one file to bring back, OUT/gpu-bench.tar.gz (result.json, tokens.npz, requests.jsonl and
# the engine-path lines of each launch).
# env: SITE (~/spec-tuner-gpu/site), WORK, OUT (./gpu-results), WORKLOAD, NUM_PROMPTS,
#      OUTPUT_LEN, CONCURRENCY (as gpu_demo.sh: instructcoder, 64, 128, 1,8,32), TRIAL_S (150),
#      BENCH_ARGS (more `tuner bench` options, word-split: e.g. the study's --stability).
set -uo pipefail
cd "$(dirname "$0")/.."
LIST=${1:?usage: scripts/gpu_bench.sh LIST [BUDGET_S]}
BUDGET_S=${2:-540}; WORK=${WORK:-$HOME/spec-tuner-gpu/bench}
. scripts/gpu_host.sh
TRIAL_S=${TRIAL_S:-150}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$WORK/gpu.txt"
while IFS='|' read -r name spec args envs; do
  case "$name" in ''|\#*) continue ;; esac
  [ -f "$WORK/$name/result.json" ] && continue
  if [ "$(left)" -lt "$TRIAL_S" ]; then
    echo "gpu_bench: $(left) s left, less than TRIAL_S=$TRIAL_S: stopping before $name"; break
  fi
  cmd=(python3 -m tuner bench --workload "$WORKLOAD" --num-prompts "$NUM_PROMPTS"
       --output-len "$OUTPUT_LEN" --concurrency "$CONCURRENCY" --speculative-config "$spec"
       --output-dir "$WORK/$name.part")
  # shellcheck disable=SC2206  # BENCH_ARGS: options, split on purpose
  cmd+=(${BENCH_ARGS:-})
  [ -n "$args" ] && cmd+=(--engine-args "$args")
  for e in $envs; do cmd+=(--engine-env "$e"); done
  rm -rf "$WORK/$name.part"
  t0=$(date +%s)
  # SIGINT at the budget (tuner's own Ctrl-C path reaps the engine), SIGKILL 30 s later.
  timeout -s INT -k 30 "$(( $(left) - 10 ))" "${cmd[@]}" 2>&1 | tail -8 | tee "$WORK/$name.txt"
  if [ -f "$WORK/$name.part/result.json" ]; then
    mv "$WORK/$name.part" "$WORK/$name"
    echo "gpu_bench: $name measured in $(( $(date +%s) - t0 )) s"
  else
    echo "gpu_bench: $name left no result ($(( $(date +%s) - t0 )) s)"
  fi
done < "$LIST"
R="$WORK/results"; rm -rf "$R"; mkdir -p "$R"
cp "$WORK/gpu.txt" "$R/"
for d in "$WORK"/*/; do
  n=$(basename "$d"); [ -f "$d/result.json" ] || continue; [ "$n" = results ] && continue
  mkdir -p "$R/$n"; cp "$d"/result.json "$d"/tokens.npz "$d"/requests.jsonl "$R/$n/" 2>/dev/null
  grep -hE "non-default args|cudagraph_mode|[Aa]sync scheduling|[Mm]odel [Rr]unner" \
    "$d/engine.log" 2>/dev/null | cut -c1-400 > "$R/$n/engine_path.txt"
done
tar -czf "$OUT/gpu-bench.tar.gz" -C "$WORK" results
echo "gpu_bench: $(( $(date +%s) - START )) s; measured: $(ls "$R" | grep -v gpu.txt | tr '\n' ' ')"
