"""STREAMS (tuner.replay.streams): where a speculative launch's bf16 output parts from the
baseline's, each config's replay follows the stream whose drafting passes it shares."""

from __future__ import annotations

import numpy as np
import pytest
from test_replay_predict import _synthetic_trial  # the synthetic engine

from tuner.records.configs import TrialConfig
from tuner.replay import acceptance, streams
from tuner.replay.predict import predict
from tuner.tokens import RequestTokens, TokenCapture

pytestmark = pytest.mark.vllm  # steps vLLM's proposers: fails where vLLM is missing


def replay_spec(capture, spec, **kwargs):
    """acceptance.replay of the --speculative-config `spec`."""
    return acceptance.replay(capture, TrialConfig(speculative_config=spec), **kwargs)


HEAVY = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 1,
         "prompt_lookup_max": 4}
# min window 60: no 60-gram of the output repeats in its context, so it never drafts
NEVER = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 60,
         "prompt_lookup_max": 60}


def test_parting_is_the_first_position_where_two_streams_differ():
    a = np.array([1, 2, 3, 4], np.int32)
    assert streams.parting(a, a.copy()) is None
    assert streams.parting(a, np.array([1, 2, 9, 4], np.int32)) == 2
    assert streams.parting(a, a[:3]) == 3  # one stopped earlier


def test_pass_shape_marks_tokens_whose_kv_came_from_a_drafting_pass():
    # The calibration launch of cpu-replay/sharegpt-8p-seed0-bf16-2pass, request 6 at c=1,
    # steps as its replay gives them (drafted/accepted): 8/0 at p=1, 8/0 at p=2, 0/0 at p=3,
    # 8/8 at p=4.
    shape = streams.pass_shape(np.array([8, 8, 0, 8]), np.array([0, 0, 0, 8]), 6)
    # token 0 fed at p=1 (drafting), 1 at p=2 (drafting), 2 at p=3 (one-token pass), 3 fed at
    # p=4 and 4, 5 accepted from that drafting pass
    assert shape.astype(int).tolist() == [1, 1, 0, 1, 1, 1]
    assert not streams.pass_shape(np.array([0, 0, 0]), np.array([0, 0, 0]), 3).any()


def _two_streams(t: int = 40) -> tuple[TokenCapture, TokenCapture]:
    """A baseline and a launch whose measured request 1 parts at output position t: the
    baseline's goes on copying its prompt (n-gram drafts get accepted), the other's does not."""
    rng = np.random.default_rng(3)
    base, alt = [], []
    for c in (1, 2):
        for warm, index in ((True, 0), (False, 0), (False, 1), (False, 2)):
            prompt = rng.integers(0, 40, 200).astype(np.int32)
            copied = np.concatenate([prompt[s:s + 10] for s in rng.integers(0, 190, 9)])
            base.append(RequestTokens(c, index, warm, prompt, copied, max_tokens=len(copied)))
            other = copied.copy()
            if c == 1 and index == 1 and not warm:  # no repeats: no drafts accepted
                other[t:] = rng.integers(100, 10_000, len(other) - t)
            alt.append(RequestTokens(c, index, warm, prompt, other, max_tokens=len(other)))
    return TokenCapture(tuple(base)), TokenCapture(tuple(alt))


def _alternate(cap: TokenCapture, spec: dict) -> streams.Alternate:
    return streams.Alternate(capture=cap, replayed=replay_spec(cap, spec), label="heavy")


def test_a_config_that_drafts_like_the_alternate_follows_it_and_one_that_never_drafts_does_not():
    base, alt_cap = _two_streams()
    alt = _alternate(alt_cap, HEAVY)
    partings = alt.partings(base)
    assert partings == {(1, 1): 40}
    heavy, switched = streams.follow(base, replay_spec(base, HEAVY), alt, partings)
    assert switched == 1
    assert heavy.level(1, warmup=False)[1] is alt_cap.level(1, warmup=False)[1]
    assert heavy.level(1, warmup=False)[0] is base.level(1, warmup=False)[0]
    never, switched = streams.follow(base, replay_spec(base, NEVER), alt, partings)
    assert switched == 0 and never is base


def test_requests_with_other_prompts_are_not_compared():
    base, alt_cap = _two_streams()
    moved = TokenCapture(tuple(
        RequestTokens(r.concurrency, r.index, r.warmup, r.prompt[::-1].copy(), r.output,
                      r.max_tokens) for r in alt_cap.requests))
    assert _alternate(moved, HEAVY).partings(base) == {}


def test_predict_replays_each_config_over_the_stream_it_follows():
    base, alt_cap = _two_streams()
    measured = [_synthetic_trial(0, base, None, "baseline"),
                _synthetic_trial(1, alt_cap, HEAVY, "calibration")]
    configs = [TrialConfig(speculative_config=HEAVY), TrialConfig(speculative_config=NEVER)]
    pred = predict(base, configs, measured, max_model_len=4096, max_num_seqs=16)
    rows = {(r.label, r.concurrency): r for r in pred.rows}
    heavy = rows[(configs[0].label(), 1)]
    own = replay_spec(alt_cap, HEAVY)[1]
    # the calibration config follows its own stream: its predicted acceptance is its own
    assert heavy.alternate_stream_requests == 1
    assert heavy.acceptance_length == pytest.approx(own.acceptance_length)
    assert heavy.acceptance_length < replay_spec(base, HEAVY)[1].acceptance_length
    assert rows[(configs[1].label(), 1)].alternate_stream_requests == 0
    assert "1 of 6 measured requests part" in pred.streams
    # without a speculative launch's tokens there is nothing to follow
    alone = predict(base, configs, measured[:1], max_model_len=4096, max_num_seqs=16)
    assert alone.streams == ""
    assert all(r.alternate_stream_requests == 0 for r in alone.rows)
