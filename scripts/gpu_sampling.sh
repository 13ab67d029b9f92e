#!/usr/bin/env bash
# On an air-gapped GPU host, once the bundle is installed (docs/gpu.md): the replay at
# temperature > 0 against vLLM's counters (benchmarks/sampled_acceptance.py): one engine per
# config, all at once on the one GPU, every case (temperature x workload x level x repeat)
# against each.
#
#   scripts/gpu_sampling.sh [BUDGET_S]     (default 420 seconds)
#
# Resumable: the run lives in WORK/sampling (default WORK=~/spec-tuner-gpu) and the same
# command measures only the cases missing. Packs OUT/gpu-sampling.tar.gz, one folder
# sampling/: every JSON of the run (run.json, engine.json, each case's case.json, result.json,
# summary.json), the baseline's token ids (base/*/tokens.npz; every config's with
# KEEP_TOKENS=1, for the replay over each config's own tokens), the printed output (run.txt)
# and the GPU (gpu.txt). Bring it back and run `benchmarks/sampled_acceptance.py analyze
# sampling` where the CPU build of vLLM is installed.
# env: SITE, WORK, OUT (./gpu-results), TEMPERATURES (0.8,1.0), WORKLOADS (instructcoder,
#      sharegpt), CONCURRENCY (1,8), REPS (2), NUM_PROMPTS (32), OUTPUT_LEN (128), KEEP_TOKENS,
#      SAMPLING_ARGS (more options of `sampled_acceptance.py run`, e.g. --parallel 4).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET_S=${1:-420}; WORK=${WORK:-$HOME/spec-tuner-gpu}; RUN=$WORK/sampling
NUM_PROMPTS=${NUM_PROMPTS:-32}; CONCURRENCY=${CONCURRENCY:-1,8}
. scripts/gpu_host.sh
mkdir -p "$RUN"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RUN/gpu.txt"
# The benchmark stops itself 25 s before the budget's end (the packing's time); SIGINT at 10 s
# before (its Ctrl-C path stops every engine), SIGKILL 30 s later.
# shellcheck disable=SC2086  # SAMPLING_ARGS: options, split on purpose
timeout -s INT -k 30 "$(( $(left) - 10 ))" python3 benchmarks/sampled_acceptance.py run \
  --out "$RUN" --budget-s "$(( $(left) - 25 ))" \
  --temperatures "${TEMPERATURES:-0.8,1.0}" --workloads "${WORKLOADS:-instructcoder,sharegpt}" \
  --concurrency "$CONCURRENCY" --reps "${REPS:-2}" --num-prompts "$NUM_PROMPTS" \
  --output-len "$OUTPUT_LEN" ${SAMPLING_ARGS:-} 2>&1 | tee -a "$RUN/run.txt"
tokens=(-path 'sampling/base/*' -name tokens.npz)
[ -n "${KEEP_TOKENS:-}" ] && tokens=(-name tokens.npz)
(cd "$WORK" && find sampling \( -name '*.json' -o -name '*.txt' -o \( "${tokens[@]}" \) \) \
  -print0 | tar -czf "$OUT/gpu-sampling.tar.gz" --null -T -)
echo "gpu_sampling: $(( $(date +%s) - START )) s; $(find "$RUN" -name case.json | wc -l) cases measured; $OUT/gpu-sampling.tar.gz"
