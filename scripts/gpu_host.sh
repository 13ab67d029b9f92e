# Sourced by the GPU host scripts (gpu_demo.sh, gpu_bench.sh) after they set BUDGET_S and a
# default WORK: the time budget (`left`), the workload both measure (one set of defaults, so a
# study and a fixed-list bench compare), the output folder, the installed bundle's environment
# and this checkout on PYTHONPATH.
START=$(date +%s)
left() { echo $(( START + BUDGET_S - $(date +%s) )); }
WORKLOAD=${WORKLOAD:-instructcoder}; NUM_PROMPTS=${NUM_PROMPTS:-64}
OUTPUT_LEN=${OUTPUT_LEN:-128}; CONCURRENCY=${CONCURRENCY:-1,8,32}
OUT=${OUT:-$PWD/gpu-results}; mkdir -p "$OUT"
SITE=${SITE:-$HOME/spec-tuner-gpu/site}; mkdir -p "$WORK"
[ -f "$SITE/spec-tuner-env.sh" ] || {
  echo "$(basename "$0"): no bundle installed in $SITE (set SITE to the folder given to install.sh)" >&2
  exit 1; }
. "$SITE/spec-tuner-env.sh"
export PYTHONPATH="$PWD:${PYTHONPATH:-}"   # this checkout is spec-tuner (the bundle has no copy)
export PYTHONUNBUFFERED=1
