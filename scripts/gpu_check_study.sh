#!/usr/bin/env bash
# On a GPU host with the bundle installed, after scripts/gpu_demo.sh: check the study's
# predictions out of sample. It replays the study (`tuner predict`, no engine), picks N configs
# the study never launched, from the predicted ranking at the first level (the best unlaunched
# one, then others spread over the top quarter), saves those predictions, and measures them
# with scripts/gpu_bench.sh (one launch each; resumable the same way).
#
#   scripts/gpu_check_study.sh [BUDGET_S]     (default 300 seconds)
#
# Back on any machine: benchmarks/out_of_sample.py results/ (predicted against measured, beside
# each level's measured spread).
# env: as gpu_demo.sh and gpu_bench.sh (SITE, OUT, WORKLOAD, NUM_PROMPTS, OUTPUT_LEN,
#      CONCURRENCY, TRIAL_S, BENCH_ARGS: measure as the study did); STUDY (default
#      ~/spec-tuner-gpu/demo/smol), N (2).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET_S=${1:-${BUDGET_S:-300}}; WORK=${WORK:-$HOME/spec-tuner-gpu/check}
. scripts/gpu_host.sh
STUDY=${STUDY:-$HOME/spec-tuner-gpu/demo/smol}
[ -d "$STUDY" ] || { echo "gpu_check_study: no study in $STUDY (run scripts/gpu_demo.sh first)" >&2; exit 1; }
LEVEL=${CONCURRENCY%%,*}
if [ ! -f "$WORK/predicted.json" ]; then
  python3 -m tuner predict "$STUDY" --levels "$CONCURRENCY" --json > "$WORK/predicted.json" || exit 1
fi
python3 - "$WORK/predicted.json" "$LEVEL" "${N:-2}" > "$WORK/launches.list" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
level, n = int(sys.argv[2]), int(sys.argv[3])
fresh = [r for r in rows if r["concurrency"] == level and r["method"] != "none"
         and not r.get("measured_trials") and r.get("pred_output_throughput")]
fresh.sort(key=lambda r: -r["pred_output_throughput"])
picks = [fresh[round(i * (len(fresh) - 1) / max(1, n - 1) / 4)] for i in range(n)] if fresh else []
seen = set()
for r in picks:
    if r["key"] in seen:
        continue
    seen.add(r["key"])
    print(f"oos-{len(seen)}|{r['speculative_config']}||")
EOF
echo "gpu_check_study: launching $(grep -c . "$WORK/launches.list") unlaunched configs:"
cat "$WORK/launches.list"
WORK="$WORK" scripts/gpu_bench.sh "$WORK/launches.list" "$(( $(left) - 5 ))"
cp "$WORK/predicted.json" "$WORK/launches.list" "$WORK/results/" 2>/dev/null
tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" results
echo "gpu_check_study: $(( $(date +%s) - START )) s; results: $OUT/gpu-check.tar.gz"
