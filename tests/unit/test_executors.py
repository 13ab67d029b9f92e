"""Where trials run: inline unless Ray is asked for, and a clear message when Ray is missing."""

from __future__ import annotations

import sys

import pytest

from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec
from tuner.search import executors

GPU = EngineSpec(model="m", device="cuda")


@pytest.mark.parametrize("engine", [EngineSpec(model="m"), GPU])
def test_one_gpu_or_a_cpu_runs_inline_even_with_ray_installed(engine):
    pytest.importorskip("ray")
    for parallel in (None, 1):
        chosen = executors.choose(engine, ray_address=None, parallel=parallel, logical_gpus=None)
        assert isinstance(chosen, executors.InlineExecutor)


@pytest.mark.parametrize(("asked", "flag"), [
    ({"ray_address": "ray://head:10001"}, "--ray-address"),
    ({"parallel": 4}, "--parallel 4"),
    ({"logical_gpus": 2}, "--logical-gpus"),
])
def test_asking_for_ray_without_ray_says_how_to_install_it(monkeypatch, asked, flag):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    kwargs = {"ray_address": None, "parallel": None, "logical_gpus": None} | asked
    with pytest.raises(ConfigError) as e:
        executors.choose(GPU, **kwargs)
    message = str(e.value)
    assert flag in message and "Ray is not installed" in message
    assert "spec-tuner[ray]" in message and "--with-ray" in message


def test_without_ray_a_plain_run_still_works(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    chosen = executors.choose(GPU, ray_address=None, parallel=None, logical_gpus=None)
    assert isinstance(chosen, executors.InlineExecutor)


@pytest.mark.parametrize(("engine", "asked", "logical", "want"), [
    (EngineSpec(model="m"), None, None, 0.0),  # the CPU: a trial holds no GPU
    (GPU, None, None, 1.0),
    (EngineSpec(model="m", device="cuda", extra_args=("-tp", "2", "--pipeline-parallel-size",
                                                      "2"), vllm_cmd=("vllm", "serve")),
     None, None, 4.0),
    (EngineSpec(model="m"), None, 2, 1.0),  # Ray's logical GPUs (tests) count as GPUs
    (GPU, 0.5, None, 0.5),  # --gpus-per-trial as asked
])
def test_gpus_per_trial_follow_the_engines_parallelism_unless_asked(engine, asked, logical,
                                                                   want):
    assert executors.gpus_per_trial(engine, asked=asked, logical_gpus=logical) == want
