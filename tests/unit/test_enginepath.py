"""The engine path read from vLLM's start-up lines, and the aligned baseline it asks for
(tuner/measure/enginepath.py).

Excerpts: vLLM 0.26.0's are built from the format strings in its source (the H200's build;
no log of it is kept here): config/vllm.py ("Async scheduling not supported with %s-based
speculative decoding and will be disabled.", "Asynchronous scheduling is %s.", "Model Runner
V2 does not yet support %s; using the V1 model runner instead."), v1/worker/gpu_worker.py
("Using V2 Model Runner"), v1/engine/core.py ("Initializing a V1 LLM engine (v%s) with
config: %s", VllmConfig.__str__), platforms/cuda.py ("Using %s attention backend out of
potential backends: %s."), config/compilation.py ("...; setting cudagraph_mode=%s") and
entrypoints/serve/utils/api_utils.py ("non-default args: %s"). vLLM 0.32.0 GPU lines come from
the same strings in 0.32's source; the 0.32 CPU excerpts are lines of real engine.logs of the
embedded model on this machine, shortened.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tuner import checks, engine_cmdline
from tuner.measure import enginepath
from tuner.measure.enginepath import EnginePath, alignment, read_log

_CONFIG_26 = ("(EngineCore pid=212) INFO 12-03 10:01:10 [core.py:117] Initializing a V1 LLM "
              "engine (v0.26.0) with config: model='/s/models/smollm2', speculative_config={spec}, "
              "tokenizer='/s/models/smollm2', skip_tokenizer_init=False, tokenizer_mode=auto, "
              "revision=None, tokenizer_revision=None, trust_remote_code=False, "
              "dtype=torch.bfloat16, max_seq_len=4096, download_dir=None, load_format=auto, "
              "tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, "
              "quantization=None, quantization_config=None, enforce_eager=False, "
              "enable_return_routed_experts=False, kv_cache_dtype=auto, device_config=cuda, "
              "seed=0, served_model_name=model, enable_prefix_caching=True, "
              "enable_chunked_prefill=True, pooler_config=None, compilation_config={{'mode': "
              "<CompilationMode.VLLM_COMPILE: 3>, 'backend': 'inductor', 'cudagraph_mode': "
              "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': [1, 2, 4, "
              "8]}}, kernel_config=KernelConfig()")
_ATTENTION_26 = ("(EngineCore pid=212) INFO 12-03 10:01:19 [cuda.py:482] Using FLASH_ATTN "
                 "attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', "
                 "'TRITON_ATTN', 'FLEX_ATTENTION'].")
_ARGS_26 = ("(APIServer pid=200) INFO 12-03 10:01:02 [api_utils.py:273] non-default args: "
            "{{'model_tag': '/s/models/smollm2', 'host': '127.0.0.1', 'port': 41234, 'api_key': "
            "['tuner-x'], 'model': '/s/models/smollm2', 'max_model_len': 4096, "
            "'served_model_name': ['model']{more}}}")
_SPEC_26 = "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)"

PLAIN_26 = "\n".join([
    _ARGS_26.format(more=""),
    "(APIServer pid=200) INFO 12-03 10:01:03 [vllm.py:1110] Asynchronous scheduling is enabled.",
    _CONFIG_26.format(spec="None"),
    "(Worker pid=230) INFO 12-03 10:01:15 [gpu_worker.py:378] Using V2 Model Runner",
    _ATTENTION_26,
])
NGRAM_26 = "\n".join([
    _ARGS_26.format(more=", 'speculative_config': {'method': 'ngram', "
                    "'num_speculative_tokens': 5, 'prompt_lookup_max': 5, 'prompt_lookup_min': 2}"),
    "(APIServer pid=200) WARNING 12-03 10:01:03 [vllm.py:1077] Async scheduling not supported "
    "with ngram-based speculative decoding and will be disabled.",
    "(APIServer pid=200) INFO 12-03 10:01:03 [vllm.py:1110] Asynchronous scheduling is disabled.",
    "(APIServer pid=200) WARNING 12-03 10:01:03 [vllm.py:584] Model Runner V2 does not yet "
    "support ngram/ngram_gpu speculative decoding; using the V1 model runner instead.",
    _CONFIG_26.format(spec=_SPEC_26),
    _ATTENTION_26,
])
# --aligned-baseline: --no-async-scheduling and VLLM_USE_V2_MODEL_RUNNER=0. No runner line at
# all: the env var short-cuts use_v2_model_runner before any warning, and V1 logs nothing.
ALIGNED_26 = "\n".join([
    _ARGS_26.format(more=", 'async_scheduling': False"),
    "(APIServer pid=200) INFO 12-03 10:01:03 [vllm.py:1110] Asynchronous scheduling is disabled.",
    _CONFIG_26.format(spec="None"),
    _ATTENTION_26,
])

_CONFIG_32_GPU = _CONFIG_26.replace("v0.26.0", "v0.32.0").replace("core.py:117", "core.py:134")
PLAIN_32_GPU = "\n".join([
    _ARGS_26.format(more="").replace("api_utils.py:273", "api_utils.py:286"),
    _CONFIG_32_GPU.format(spec="None"),
    "(Worker pid=230) INFO 12-03 10:01:15 [gpu_worker.py:518] Using V2 Model Runner",
    _ATTENTION_26,
])
NGRAM_32_GPU = "\n".join([
    "(APIServer pid=200) WARNING 12-03 10:01:03 [vllm.py:1605] Async scheduling not supported "
    "with ngram-based speculative decoding and will be disabled.",
    _CONFIG_32_GPU.format(spec=_SPEC_26),
    "(Worker pid=230) INFO 12-03 10:01:15 [gpu_worker.py:518] Using V2 Model Runner",
    _ATTENTION_26,
])

_CPU_32 = [
    "(APIServer pid=3509) INFO 12-03 13:30:27 [api_utils.py:286] non-default args: {{'host': "
    "'127.0.0.1', 'port': 54441, 'api_key': '***', 'model': "
    "'/root/.cache/spec-tuner/models/smollm2-135m-instruct-bf16', 'max_model_len': 4096, "
    "'enforce_eager': True, 'served_model_name': ['model']{more}}}",
    "{spec_warning}",
    "(APIServer pid=3509) WARNING 12-03 13:30:28 [vllm.py:1703] Enforce eager set, disabling "
    "torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting "
    "-cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False",
    "(APIServer pid=3509) WARNING 12-03 13:30:28 [vllm.py:725] Model Runner V2 requires Triton; "
    "using the V1 model runner instead.",
    "(EngineCore pid=3521) INFO 12-03 13:30:39 [core.py:133] Initializing a V1 LLM engine "
    "(v0.32.0) with config: model='/root/.cache/spec-tuner/models/smollm2-135m-instruct-bf16', "
    "speculative_config={spec}, dtype=torch.bfloat16, max_seq_len=4096, enforce_eager=True, "
    "kv_cache_dtype=auto, device_config=cpu, compilation_config={{'mode': "
    "<CompilationMode.NONE: 0>, 'backend': 'inductor', 'cudagraph_mode': "
    "<CUDAGraphMode.NONE: 0>}}, kernel_config=KernelConfig()",
    "(Worker pid=3533) INFO 12-03 13:30:47 [parallel_state.py:1906] world_size=1 rank=0 "
    "local_rank=0 distributed_init_method=file:///tmp/vllm_dist_ed2c backend=gloo",
]
PLAIN_32_CPU = "\n".join(_CPU_32).format(more="", spec_warning="", spec="None")
NGRAM_32_CPU = "\n".join(_CPU_32).format(
    more=", 'speculative_config': {'method': 'ngram', 'num_speculative_tokens': 5}",
    spec_warning="(APIServer pid=3813) WARNING 12-03 13:33:24 [vllm.py:1605] Async scheduling "
                 "not supported with ngram-based speculative decoding and will be disabled.",
    spec=_SPEC_26)


def test_vllm_026_plain_baseline_runs_v2_with_async_scheduling() -> None:
    path = read_log(PLAIN_26)
    assert path == EnginePath(model_runner="V2", async_scheduling="true",
                              cudagraph_mode="FULL_AND_PIECEWISE", attention_backend="FLASH_ATTN")


def test_vllm_026_ngram_falls_back_to_v1_without_async_scheduling() -> None:
    path = read_log(NGRAM_26)
    assert (path.model_runner, path.async_scheduling, path.inferred) == ("V1", "false", ())


def test_vllm_026_aligned_trial_prints_no_runner_line_and_still_gets_one() -> None:
    env = {enginepath.MODEL_RUNNER_ENV: "0"}
    path = read_log(ALIGNED_26, env=env)
    assert (path.model_runner, path.async_scheduling) == ("V1", "false")
    assert path.inferred == ("model_runner",)
    # Without the env var, the absence of the V2 worker's INFO line still means V1.
    assert read_log(ALIGNED_26).model_runner == "V1"


def test_vllm_026_alignment_is_no_async_scheduling_and_the_v1_runner() -> None:
    found = alignment(read_log(PLAIN_26), read_log(NGRAM_26))
    assert found is not None
    assert found.engine_args == ("--no-async-scheduling",)
    assert found.engine_env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert [d.field for d in found.differences] == ["model_runner", "async_scheduling"]
    assert "async_scheduling: true without speculation, false with it" in found.describe()
    # The aligned trial is on the speculative path: nothing left to align.
    aligned = read_log(ALIGNED_26, env=found.engine_env)
    assert alignment(aligned, read_log(NGRAM_26)) is None


def test_vllm_032_gpu_keeps_v2_for_ngram_and_only_async_scheduling_differs() -> None:
    plain, ngram = read_log(PLAIN_32_GPU), read_log(NGRAM_32_GPU)
    # 0.32 logs nothing when async scheduling stays on: the source's default, marked inferred.
    assert (plain.async_scheduling, plain.inferred) == ("true", ("async_scheduling",))
    assert (ngram.model_runner, ngram.async_scheduling) == ("V2", "false")
    found = alignment(plain, ngram)
    assert found is not None
    assert (found.engine_args, found.engine_env) == (("--no-async-scheduling",), {})


def test_vllm_032_cpu_ngram_keeps_the_baselines_path() -> None:
    plain, ngram = read_log(PLAIN_32_CPU), read_log(NGRAM_32_CPU)
    assert plain == EnginePath(model_runner="V1", async_scheduling="false",
                               cudagraph_mode="NONE", attention_backend="CPU_ATTN",
                               inferred=("async_scheduling", "attention_backend"))
    assert (ngram.model_runner, ngram.async_scheduling) == ("V1", "false")
    assert alignment(plain, ngram) is None


def test_a_runtime_cudagraph_downgrade_and_a_chosen_backend_are_read() -> None:
    downgrade = ("(Worker pid=230) WARNING 12-03 10:01:20 [compilation.py:1395] "
                 "CUDAGraphMode.FULL_AND_PIECEWISE is not supported with FLASHINFER backend "
                 "(support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting "
                 "cudagraph_mode=PIECEWISE")
    chosen = ("(EngineCore pid=212) INFO 12-03 10:01:19 [cuda.py:422] Using "
              "AttentionBackendEnum.FLASHINFER backend.")
    spec = read_log("\n".join([NGRAM_26.replace(_ATTENTION_26, chosen), downgrade]))
    assert (spec.cudagraph_mode, spec.attention_backend) == ("PIECEWISE", "FLASHINFER")
    found = alignment(read_log(PLAIN_26), spec)
    assert found is not None
    assert found.engine_args == ("--no-async-scheduling",
                                 '--compilation-config={"cudagraph_mode": "PIECEWISE"}',
                                 "--attention-backend=FLASHINFER")
    config = found.trial_config()
    assert config.speculative_config is None
    assert engine_cmdline.engine_flags(config) == [
        "--attention-backend", "FLASHINFER", "--compilation-config",
        '{"cudagraph_mode": "PIECEWISE"}', "--no-async-scheduling"]


def test_the_alignment_reads_back_through_the_aligned_baseline_option() -> None:
    """What `alignment` gives, typed as `--aligned-baseline ARGS --aligned-baseline-env
    NAME=VALUE`, is the same baseline: its args are whole argv items argparse keeps."""
    spec = read_log(NGRAM_26.replace(_ATTENTION_26, "(EngineCore pid=1) INFO 12-03 10:01:19 "
                                     "[cuda.py:422] Using FLASHINFER backend."))
    found = alignment(read_log(PLAIN_26), spec)
    assert found is not None
    typed = checks.aligned_baseline(shlex.join(found.engine_args),
                                    [f"{k}={v}" for k, v in found.engine_env.items()])
    assert typed == found.trial_config()


def test_unknown_fields_are_no_evidence_of_a_difference() -> None:
    assert alignment(EnginePath(), read_log(NGRAM_26)) is None
    # A log without INFO lines (VLLM_LOGGING_LEVEL=WARNING) cannot say V1 by silence.
    quiet = "\n".join(line for line in ALIGNED_26.splitlines() if " INFO " not in line)
    assert read_log(quiet + "\n" + _CONFIG_26.format(spec="None").replace(" INFO ", " WARN "))\
        .model_runner is None
    assert read_log("INFO fake engine: nothing of vLLM's") == EnginePath()


def test_details_round_trip_and_old_stored_values_normalize() -> None:
    path = read_log(ALIGNED_26, env={enginepath.MODEL_RUNNER_ENV: "0"})
    assert path.details()["inferred"] == "model_runner"
    assert EnginePath.from_details(path.details()) == path
    # Stored by the tuner before values were normalized.
    old = EnginePath.from_details({"model_runner": "V1", "async_scheduling": "disabled",
                                   "cudagraph_mode": "PIECEWISE", "enforce_eager": "False"})
    assert (old.model_runner, old.async_scheduling, old.cudagraph_mode) == \
        ("V1", "false", "PIECEWISE")
    assert EnginePath.from_details(None) == EnginePath()


@pytest.mark.parametrize("text, want", [
    ("(APIServer pid=3509) INFO 12-03 13:30:24 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  "
     "version 0.32.0", "0.32.0"),
    (_CONFIG_26.format(spec="None"), "0.26.0"),
    ("INFO 12-03 10:00:00 [api_server.py:1] vLLM API server version 0.0.0+fake", "0.0.0+fake"),
    ("no version here", None),
])
def test_the_version_falls_back_to_the_start_up_lines(text: str, want: str | None) -> None:
    assert enginepath.log_version(text) == want


def test_settings_beside_the_path_come_from_the_config_line() -> None:
    assert enginepath.log_settings(PLAIN_32_CPU) == {"enforce_eager": "True", "dtype": "bfloat16"}


# Real vLLM 0.26.0 logs from the H200 (tests/data/vllm026/SOURCE.md says how they were cut).
_REAL_26 = Path(__file__).resolve().parents[1] / "data" / "vllm026"


def _real_26(name: str) -> str:
    return (_REAL_26 / name).read_text(encoding="utf-8")


def test_real_vllm_026_logs_give_each_trials_path() -> None:
    plain = read_log(_real_26("trial0.log"))
    ngram = read_log(_real_26("trial1.log"))
    aligned = read_log(_real_26("trial2.log"), env={enginepath.MODEL_RUNNER_ENV: "0"})
    assert (plain.model_runner, plain.async_scheduling) == ("V2", "true")
    assert (ngram.model_runner, ngram.async_scheduling) == ("V1", "false")
    assert (aligned.model_runner, aligned.async_scheduling) == ("V1", "false")
    assert {p.attention_backend for p in (plain, ngram, aligned)} == {"FLASH_ATTN"}
    # Stated by a line: the runner of trials 0 and 1, async scheduling of trials 1 and 2
    # (trial 2's comes from the non-default args); trial 0 prints nothing when async is on.
    assert (plain.inferred, ngram.inferred, aligned.inferred) == \
        (("async_scheduling",), (), ("model_runner",))
    # Without the env, the INFO lines without "Using V2 Model Runner" still mean V1.
    assert read_log(_real_26("trial2.log")).model_runner == "V1"


def test_real_vllm_026_alignment_matches_what_the_aligned_trial_was_launched_with() -> None:
    found = alignment(read_log(_real_26("trial0.log")), read_log(_real_26("trial1.log")))
    assert found is not None
    assert found.engine_args == ("--no-async-scheduling",)
    assert found.engine_env == {enginepath.MODEL_RUNNER_ENV: "0"}
    aligned = read_log(_real_26("trial2.log"), env=found.engine_env)
    assert alignment(aligned, read_log(_real_26("trial1.log"))) is None


@pytest.mark.parametrize(("eager", "mode"), [("False", "FULL_AND_PIECEWISE"), ("True", "NONE")])
def test_a_cuda_config_line_without_a_graph_mode_takes_the_default_levels_mode(eager, mode):
    # vLLM 0.26 prints the compilation config with exclude_unset, so a line may lack the
    # mode (the H200 run's lines stated FULL_AND_PIECEWISE; this is the fallback).
    line = ("(EngineCore pid=2397) INFO 12-03 14:48:09 [core.py:116] Initializing a V1 LLM "
            "engine (v0.26.0) with config: model='m', speculative_config=None, "
            f"enforce_eager={eager}, device_config=cuda, compilation_config={{'mode': "
            "<CompilationMode.VLLM_COMPILE: 3>, 'backend': 'inductor'}")
    path = read_log(line)
    assert path.cudagraph_mode == mode and "cudagraph_mode" in path.inferred
    cpu = read_log(line.replace("device_config=cuda", "device_config=cpu"))
    assert cpu.cudagraph_mode is None


# -- the n-gram proposer a launch ran (EngineInfo.details["ngram_path"]) -------------------------
def test_each_ngram_launch_records_the_proposer_its_runner_builds() -> None:
    # vLLM 0.26 on the GPU: n-gram falls back to the V1 runner, so V1's numba proposer.
    assert (read_log(NGRAM_26).ngram_path, read_log(NGRAM_26).inferred) == ("V1", ())
    assert read_log(_real_26("trial1.log")).ngram_path == "V1"
    # vLLM 0.32 on the GPU keeps the V2 runner: its Triton scan. On the CPU build: no Triton, V1.
    assert read_log(NGRAM_32_GPU).ngram_path == "V2"
    assert read_log(NGRAM_32_CPU).ngram_path == "V1"
    # No speculation, no proposer: the plain and the aligned baselines record none.
    for text in (PLAIN_26, ALIGNED_26, PLAIN_32_GPU, PLAIN_32_CPU, _real_26("trial0.log")):
        assert read_log(text).ngram_path is None
        assert "ngram_path" not in read_log(text).details()


def test_ngram_gpu_on_v1_is_its_own_proposer_and_a_method_from_the_args_counts() -> None:
    gpu_v1 = NGRAM_26.replace("method='ngram'", "method='ngram_gpu'")
    assert read_log(gpu_v1).ngram_path == "V1-gpu"
    assert read_log(NGRAM_32_GPU.replace("method='ngram'", "method='ngram_gpu'")).ngram_path \
        == "V2"
    # The config line cut before its speculative_config: the non-default args still say it.
    cut = NGRAM_26.replace(f"speculative_config={_SPEC_26}", "")
    assert read_log(cut).ngram_path == "V1"
    suffix = NGRAM_32_GPU.replace("method='ngram'", "method='suffix'")
    assert read_log(suffix).ngram_path is None


def test_an_unknown_runner_leaves_the_ngram_path_unknown_and_an_inferred_one_says_so() -> None:
    # No INFO lines: the runner is not known, so neither is the proposer.
    quiet = "\n".join(line.replace(" INFO ", " WARN ") for line in NGRAM_32_GPU.splitlines()
                      if "Using V2 Model Runner" not in line)
    assert (read_log(quiet).model_runner, read_log(quiet).ngram_path) == (None, None)
    # The runner by silence (INFO lines, no V2 line): V1, and the proposer inferred with it.
    silent = "\n".join(line for line in NGRAM_32_GPU.splitlines()
                       if "Using V2 Model Runner" not in line)
    path = read_log(silent)
    assert (path.model_runner, path.ngram_path) == ("V1", "V1")
    assert {"model_runner", "ngram_path"} <= set(path.inferred)
    assert EnginePath.from_details(path.details()) == path
    assert "n-gram proposer V1" in path.describe()
    assert EnginePath.from_details({"ngram_path": "V9"}).ngram_path is None


def test_details_stored_before_the_proposer_was_recorded_still_give_it_by_the_runner() -> None:
    # What the stored vLLM 0.26 launches hold (benchmarks/data/h100/.../engine.json).
    old = {"model_runner": "V1", "async_scheduling": "false", "cudagraph_mode": "PIECEWISE"}
    assert enginepath.ngram_path_of(old, "ngram") == "V1"
    assert enginepath.ngram_path_of({**old, "model_runner": "V2"}, "ngram") == "V2"
    assert enginepath.ngram_path_of(old, "suffix") is None
    assert enginepath.ngram_path_of({}, "ngram") is None  # no runner: unknown stays unknown
    assert enginepath.ngram_path_of(read_log(NGRAM_32_GPU).details(), "ngram") == "V2"
