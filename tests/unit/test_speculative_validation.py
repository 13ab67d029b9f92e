"""Checks before a launch: a --speculative-config vLLM's own SpeculativeConfig would refuse is
refused before any engine starts (tuner.speculative.config_check.vllm_answer runs vLLM's source
of that class over stand-ins for vLLM proper; tuner.checks.vllm_accepts words the refusal), with
vLLM's reason, and never for a reason of the stand-ins' own."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tuner import checks
from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec
from tuner.speculative import config_check

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM's SpeculativeConfig is what is checked against")

ENGINE = EngineSpec(model="/models/target", model_name="target", device="cpu")
EAGLE_REASON = ("num_speculative_tokens must be provided with speculative model unless the "
                "draft model config contains an n_predict parameter")

# (config, a fragment of vLLM's reason)
REFUSED = [
    ({"method": "eagle"}, EAGLE_REASON),
    ({"method": "eagle", "num_speculative_tokens": 3},
     "num_speculative_tokens was provided but without speculative model"),
    ({"method": "draft_model", "num_speculative_tokens": 3},
     "num_speculative_tokens was provided but without speculative model"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "greater than 0"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
      "prompt_lookup_max": 2}, "prompt_lookup_min=5 must be <= prompt_lookup_max=2"),
    ({"method": "ngram", "num_speculative_tokens": 3, "tensor_parallel_size": 2},
     "Please pass 'draft_tensor_parallel_size' instead"),
    ({"method": "ngram", "num_speculative_tokens": 3, "kv_cache_dtype": "fp7"},
     "kv_cache_dtype: Input should be 'auto'"),
    ({"method": "ngram", "num_speculative_tokens": 3, "no_such_key": 1},
     "no_such_key: Unexpected keyword argument"),
    ({"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_min_token_prob": 2.0},
     "suffix_decoding_min_token_prob=2.0 must be in [0, 1]"),
    ({"method": "ngram", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[2, 8, 3]]},
     "The first batch-size range must start at 1"),
]
# Configs vLLM takes as far as it can tell without a model: never refused here.
ACCEPTED = [
    {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
     "prompt_lookup_max": 4},
    {"method": "ngram", "num_speculative_tokens": 4,
     "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 64, 1]]},
    {"method": "suffix", "num_speculative_tokens": 8},
    {"method": "eagle", "model": "/models/eagle-head", "num_speculative_tokens": 3},
    {"method": "draft_model", "model": "org/draft", "num_speculative_tokens": 3},
    {"method": "mtp", "num_speculative_tokens": 1},
    {"method": "ngram", "num-speculative-tokens": 3},  # vLLM reads `-` as `_`
]


@pytest.mark.parametrize("spec, reason", REFUSED, ids=[str(s) for s, _ in REFUSED])
def test_vllm_refuses_with_its_reason(spec, reason):
    answer = config_check.vllm_answer(spec, model=ENGINE.model)
    assert answer.refused is not None and reason in answer.refused, answer
    assert answer.origin.startswith("vLLM ")


@pytest.mark.parametrize("spec", ACCEPTED, ids=[str(s) for s in ACCEPTED])
def test_what_vllm_takes_is_not_refused(spec):
    answer = config_check.vllm_answer(spec, model=ENGINE.model)
    assert answer.refused is None, answer
    checks.vllm_accepts(spec, ENGINE, where="--speculative-config")


def test_where_vllm_needs_a_model_the_check_stops_and_says_so():
    answer = config_check.vllm_answer({"method": "eagle", "model": "/m",
                                        "num_speculative_tokens": 3})
    assert answer.refused is None and "ModelConfig" in answer.checked
    assert "launch" in answer.checked


def test_the_real_vllm_class_agrees():
    # The same configs through the imported SpeculativeConfig (no engine, no model: the target
    # config None, as far as these reach): the reasons agree word for word. Importing vLLM
    # takes seconds; the point of the stand-ins is that a refusal does not.
    from vllm.config.speculative import SpeculativeConfig

    path = sys.modules[SpeculativeConfig.__module__].__file__
    for spec, _ in REFUSED:
        if "num_speculative_tokens_per_batch_size" in spec:
            continue  # the scheduler checks that, not the class
        try:
            SpeculativeConfig(**spec, target_model_config=None, target_parallel_config=None)
        except Exception as e:
            real = config_check._validation_reason(e, path) or str(e)
        else:
            real = None
        assert real == config_check.vllm_answer(spec).refused, spec


def test_the_answer_imports_no_vllm():
    # What makes it fast (no torch, no vLLM: seconds saved per check); checked by what is
    # imported, not by a clock, which the machine's load can stop.
    code = ("import sys; "
            "from tuner.speculative import config_check; "
            "v = config_check.vllm_answer({'method': 'eagle'}); "
            "print('vllm' in sys.modules, 'torch' in sys.modules, v.refused)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split(" ", 2)
    assert out[0] == "False", "the real vLLM was imported"
    assert out[1] == "False", "torch was imported"
    assert EAGLE_REASON in out[2]


# --- the refusal the user reads ----------------------------------------------------------------
def test_one_clear_message_the_value_vllms_reason_and_what_to_do():
    with pytest.raises(ConfigError) as e:
        checks.vllm_accepts({"method": "eagle"}, ENGINE, where="--speculative-config")
    msg = str(e.value)
    assert msg.startswith("--speculative-config '{\"method\":\"eagle\"}': vLLM ")
    assert "SpeculativeConfig refuses it" in msg and EAGLE_REASON in msg
    assert 'needs "model"' in msg and '"num_speculative_tokens":3' in msg
    assert "ngram, suffix" in msg and "--speculative-config none" in msg
    assert "\n" not in msg


def test_a_schedule_the_proposer_cannot_take_is_refused_before_a_launch():
    spec = {"method": "suffix", "num_speculative_tokens": 8,
            "num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 64, 4]]}
    with pytest.raises(ConfigError, match="suffix_decoding.py") as e:
        checks.vllm_accepts(spec, ENGINE, where="--speculative-config")
    assert "tuner policy" in str(e.value)
    # One K throughout is no change of K: vLLM takes it.
    checks.vllm_accepts({**spec, "num_speculative_tokens_per_batch_size": [[1, 64, 8]]}, ENGINE,
                        where="--speculative-config")


def test_bench_checks_its_config_before_anything_else(tmp_path):
    from tuner.records.configs import TrialConfig, WorkloadSpec
    from tuner.records.options import BenchOptions

    options = BenchOptions(workload=WorkloadSpec(name="instructcoder"), engine=ENGINE,
                           config=TrialConfig(speculative_config={"method": "eagle"}),
                           out_dir=tmp_path / "bench")
    with pytest.raises(ConfigError, match="SpeculativeConfig refuses it"):
        checks.bench_options(options, ENGINE)


def test_optimize_checks_every_method_of_its_space():
    from tuner.search import space as spaces

    space = spaces.parse({"name": "bad", "methods": {"ngram": {
        "num_speculative_tokens": {"type": "int", "low": 1, "high": 4},
        "prompt_lookup_min": 5, "prompt_lookup_max": 2}}})
    with pytest.raises(ConfigError, match="prompt_lookup_min=5 must be <= prompt_lookup_max=2"):
        checks.check_methods(space, ENGINE)
    for name in ("default", "ngram", "ngram_small", "suffix"):
        checks.check_methods(spaces.load(name), ENGINE)  # the built-in spaces all pass


def test_cli_refuses_eagle_without_a_draft_before_any_engine_starts(tmp_path: Path):
    # The command: an engine launched and failed after ~10 s; now vLLM's reason comes
    # before any engine starts (nothing is made; no clock is read: a timed test fails on load).
    r = subprocess.run([sys.executable, "-m", "tuner", "bench", "--speculative-config",
                        '{"method":"eagle"}', "--output-dir", str(tmp_path / "bench")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert EAGLE_REASON in r.stderr and 'needs "model"' in r.stderr
    assert not (tmp_path / "bench").exists()  # nothing made, nothing launched
