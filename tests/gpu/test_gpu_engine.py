"""GPU build of vLLM on an NVIDIA machine (marked `gpu`; skipped with a reason elsewhere)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from tuner import api
from tuner.api import engines
from tuner.measure.machine import has_nvidia_gpu
from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import BenchOptions, EngineOptions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not has_nvidia_gpu(), reason="no NVIDIA GPU on this machine"),
]


def test_ngram_on_the_gpu_build_measures_acceptance(tmp_path):
    pytest.importorskip("vllm", reason="vLLM's GPU build is not installed")
    model = os.environ.get("SPEC_TUNER_GPU_MODEL")  # else the embedded SmolLM2
    engine = engines.resolve_engine(EngineOptions(
        model=model, extra_args=tuple(shlex.split(os.environ.get("SPEC_TUNER_GPU_ARGS", "")))))
    assert engine.device == "cuda"
    spec = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
            "prompt_lookup_max": 5}
    result = api.bench(BenchOptions(
        workload=WorkloadSpec(name="instructcoder", num_prompts=4, output_len=64),
        config=TrialConfig(speculative_config=spec),
        settings=MeasureSettings(concurrencies=(1, 4)), out_dir=tmp_path), engine=engine, say=lambda _m: None)
    assert all(lv.completed == lv.num_requests for lv in result.levels)
    assert result.levels[0].spec_decode_num_drafts > 0
    assert Path(tmp_path / "engine.log").exists()
