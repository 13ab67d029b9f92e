# Sourced by the GPU host scripts (gpu_demo.sh, gpu_bench.sh) after they set BUDGET_S and a
# default WORK: the time budget (`left`), the output folder, the installed bundle's environment
# and this checkout on PYTHONPATH.
START=$(date +%s)
left() { echo $(( START + BUDGET_S - $(date +%s) )); }
OUT=${OUT:-$PWD/gpu-results}; mkdir -p "$OUT"
SITE=${SITE:-/root/site}; mkdir -p "$WORK"
. "$SITE/spec-tuner-env.sh"
export PYTHONPATH="$PWD:${PYTHONPATH:-}"   # this checkout is spec-tuner (the bundle has no copy)
export PYTHONUNBUFFERED=1
