"""Schedules vLLM accepts: which methods' proposers take a K that changes with the batch size
(tuner.speculative.schedule_rules.varying_k), that the installed vLLM's source still says so,
and that the policy emits a per-batch-size schedule only for those, offering bands (and why)
for the rest; the replay reads the same rule."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from study_fakes import ladder_runs

from tuner.analysis import policy as P
from tuner.analysis import schedule as S
from tuner.outputs import policy_words
from tuner.records.configs import TrialConfig
from tuner.records.policy import PolicyDocument
from tuner.speculative.schedule_rules import varying_k

# method -> (accepted on the V1 runner, accepted on the V2 runner)
RULE = {
    "ngram": (True, True),
    "ngram_gpu": (False, True),
    "eagle": (True, True),
    "eagle3": (True, True),
    "mtp": (True, True),
    "deepseek_mtp": (True, True),  # vLLM maps every *_mtp name to mtp
    "dflash": (True, True),
    "dspark": (True, True),
    "draft_model": (True, True),
    "suffix": (False, False),
    "medusa": (False, False),
    "extract_hidden_states": (False, False),
    "custom_class": (False, False),
    "mlp_speculator": (False, False),
    "a_method_from_a_newer_vllm": (False, False),
}


@pytest.mark.parametrize("method", sorted(RULE))
def test_the_rule_per_method(method):
    v1, v2 = RULE[method]
    assert varying_k(method, runner="V1").accepted is v1
    assert varying_k(method, runner="V2").accepted is v2
    # The runner unknown: accepted only where both runners accept it.
    unknown = varying_k(method)
    assert unknown.accepted is (v1 and v2)
    assert unknown.why  # every answer says why


def test_every_refusal_names_the_vllm_source_that_decides_it():
    assert "vllm/v1/spec_decode/suffix_decoding.py" in varying_k("suffix").why
    assert "assert num_speculative_tokens == self.num_speculative_tokens" in \
        varying_k("suffix").why
    assert "medusa.py" in varying_k("medusa").why
    assert "ngram_proposer_gpu.py" in varying_k("ngram_gpu", runner="V1").why
    assert "not known" in varying_k("ngram_gpu").why


def _vllm_file(rel: str) -> str:
    spec = importlib.util.find_spec("vllm")  # locates vLLM, runs none of it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed in this Python")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        pytest.skip(f"this vLLM has no {rel}")
    return path.read_text()


# What the rule rests on, as the lines of the installed vLLM (0.32 here): if vLLM changes one,
# this test says which answer to read again.
SOURCE_LINES = [
    ("v1/spec_decode/suffix_decoding.py",
     "assert num_speculative_tokens == self.num_speculative_tokens"),
    ("v1/spec_decode/medusa.py", "assert num_speculative_tokens == self.num_speculative_tokens"),
    ("v1/spec_decode/extract_hidden_states.py",
     "assert num_speculative_tokens == self.num_speculative_tokens"),
    ("v1/spec_decode/ngram_proposer.py", "assert num_speculative_tokens <= self.k"),
    ("v1/spec_decode/ngram_proposer_gpu.py", "assert num_speculative_tokens == self.k"),
    ("v1/spec_decode/llm_base_proposer.py",
     "self.num_speculative_tokens = num_speculative_tokens"),
    ("v1/worker/gpu/model_runner.py", "draft_tokens[:, num_spec_tokens:] = -1"),
    ("v1/core/sched/scheduler.py",
     "self.dynamic_sd_lookup[\n                len(num_scheduled_tokens)"),
]


@pytest.mark.parametrize("rel, line", SOURCE_LINES, ids=[r for r, _ in SOURCE_LINES])
def test_the_installed_vllm_source_still_says_so(rel, line):
    assert line in _vllm_file(rel), \
        f"{rel} changed: read tuner/speculative/schedule_rules.py's rule again"


def test_v2_does_not_run_the_fixed_k_methods():
    # V2 falls back to V1 for these, which is why V1's proposer decides for them.
    text = _vllm_file("config/vllm.py")
    block = text[text.index("def _get_v2_model_runner_unsupported_features"):]
    block = block[:block.index("return unsupported")]
    for method in ("suffix", "medusa", "mlp_speculator", "custom_class"):
        assert f'"{method}"' in block


# --- the policy reads the rule ----------------------------------------------------------------
def _ladder_runs(key: str, speedups: dict[int, list[float]]):
    return ladder_runs(key, {c: [10 * x for x in s] for c, s in speedups.items()})


SPECS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2,
              "prompt_lookup_max": 4},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8},
    "eagle": {"method": "eagle", "model": "org/eagle-head", "num_speculative_tokens": 8},
    "draft_model": {"method": "draft_model", "model": "org/draft", "num_speculative_tokens": 8},
    "medusa": {"method": "medusa", "model": "org/medusa", "num_speculative_tokens": 8},
    "ngram_gpu": {"method": "ngram_gpu", "num_speculative_tokens": 8},
}


def _policy(method: str, *, runner: str | None = None) -> PolicyDocument:
    """A ladder where K=8 pays best at c=1, K=4 at c=4, and neither at c=16."""
    k8 = TrialConfig(speculative_config=SPECS[method])
    k4 = k8.with_k(4)
    lineup = [("baseline", TrialConfig()), ("leader", k8), ("k_variant", k4)]
    measured = (_ladder_runs(TrialConfig().key(), {1: [1.0, 1.0], 4: [1.0, 1.0], 16: [1.0, 1.0]})
                + _ladder_runs(k8.key(), {1: [2.0, 2.02], 4: [1.1, 1.1], 16: [0.8, 0.8]})
                + _ladder_runs(k4.key(), {1: [1.6, 1.6], 4: [1.3, 1.31], 16: [0.9, 0.9]}))
    return policy_words.worded(P.draft_policy(measured, lineup, max_batch=64, where="x",
                                                 varying_k=varying_k(method, runner=runner)))


@pytest.mark.parametrize("method", ["ngram", "eagle", "draft_model"])
def test_a_method_that_takes_a_changing_k_gets_a_schedule(method):
    doc = _policy(method)
    spec = doc.speculative_config
    assert doc.schedule == ((1, 1, 8), (2, 11, 4), (12, 64, 0))
    assert spec["num_speculative_tokens_per_batch_size"] == [list(b) for b in doc.schedule]
    assert spec["num_speculative_tokens"] == 8
    assert doc.schedule_refused is None and doc.fallback_bands is None


@pytest.mark.parametrize("method", ["suffix", "medusa", "ngram_gpu"])
def test_a_method_that_takes_no_changing_k_gets_bands_and_why(method):
    doc = _policy(method)
    # No schedule, and no config a verify launch would spend an engine on.
    assert doc.schedule is None and doc.speculative_config is None
    assert doc.bands == ((1, 1, 8), (2, 11, 4), (12, 64, 0))
    assert doc.schedule_refused == varying_k(method).why
    assert doc.fallback_bands[0].startswith("concurrency 1-")
    assert doc.fallback_bands[-1].endswith("speculation off")
    headline = doc.headline
    assert headline.startswith("No per-batch-size schedule for")
    assert varying_k(method).why in headline and "static K per band" in headline
    assert "speculation stops paying from concurrency" in headline
    assert "Speculation does not pay" not in headline


def test_ngram_gpu_on_a_known_v2_runner_gets_its_schedule():
    doc = _policy("ngram_gpu", runner="V2")
    assert doc.speculative_config["num_speculative_tokens_per_batch_size"] == [
        list(b) for b in doc.schedule]


def test_one_k_everywhere_needs_no_schedule_and_stays_a_static_config():
    spec = SPECS["suffix"]
    suffix = TrialConfig(speculative_config=spec)
    assert S.policy_config(suffix, [(1, 64, 8)], varying_k=varying_k("suffix")
                           ).speculative_config == spec
    assert S.schedule_refused([(1, 4, 8), (5, 64, 8)], varying_k("suffix")) is None
    # Without the rule (an older caller) the schedule is emitted as before.
    assert "num_speculative_tokens_per_batch_size" in S.policy_config(
        suffix, [(1, 4, 8), (5, 64, 4)]).speculative_config


# --- the replay reads the rule ----------------------------------------------------------------
def test_the_replay_refuses_a_suffix_schedule_with_the_rules_reason():
    import numpy as np

    from tuner.replay import acceptance
    from tuner.tokens import RequestTokens, TokenCapture

    cap = TokenCapture(requests=(RequestTokens(
        concurrency=1, index=0, warmup=False, prompt=np.array([1, 2, 3, 1, 2], np.int32),
        output=np.array([3, 1, 2, 3], np.int32), max_tokens=4),))
    spec = {"method": "suffix", "num_speculative_tokens": 4,
            "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 8, 2]]}
    with pytest.raises(ValueError, match="per-batch-size") as e:
        acceptance.replay(cap, TrialConfig(speculative_config=spec), max_num_seqs=8)
    assert "suffix_decoding.py" in str(e.value)


def test_the_terminal_says_bands_not_a_schedule():
    from tuner.outputs import console

    text = console.format_policy(_policy("suffix"))
    assert text.startswith("Load-aware policy: No per-batch-size schedule for suffix")
    assert "schedule: none; bands (a static K each): [[1, 1, 8], [2, 11, 4], [12, 64, 0]]" in text
    assert "router band: concurrency 12 and above: speculation off" in text
    assert "schedule: [[1, 1, 8]" in console.format_policy(_policy("ngram"))
