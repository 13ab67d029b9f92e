"""The acceptance replay against the installed vLLM's own proposers, on random token streams.

The reference loops here drive vLLM's proposer classes the way the GPU model runner does (one
request, one step at a time, context = prompt + tokens so far) and check each draft against the
recorded continuation. The replay must give the same (drafted, accepted) at every step.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from tuner.records.configs import TrialConfig
from tuner.replay import acceptance
from tuner.tokens import RequestTokens, TokenCapture

pytestmark = pytest.mark.vllm  # steps vLLM's proposers: fails where vLLM is missing


def replay_spec(capture, spec, **kwargs):
    """acceptance.replay of the --speculative-config `spec`."""
    return acceptance.replay(capture, TrialConfig(speculative_config=spec), **kwargs)


def _capture(seed: int, *, levels=(1,), n=6, vocab=6, prompt=120, output=90,
             warmups=2) -> TokenCapture:
    rng = np.random.default_rng(seed)
    reqs = []
    for c in levels:
        for warm, count in ((True, warmups), (False, n)):
            for i in range(count):
                p = rng.integers(0, vocab, int(rng.integers(prompt // 2, prompt))).astype(np.int32)
                o = rng.integers(0, vocab, int(rng.integers(2, output))).astype(np.int32)
                reqs.append(RequestTokens(c, i, warm, p, o, max_tokens=output))
    return TokenCapture(tuple(reqs))


def _ngram_reference(req: RequestTokens, *, k: int, lo: int, hi: int, max_model_len: int):
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    cfg = types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(prompt_lookup_min=lo, prompt_lookup_max=hi,
                                                 num_speculative_tokens=k),
        model_config=types.SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=types.SimpleNamespace(max_num_seqs=4),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1))
    proposer = NgramProposer(cfg)
    tokens = np.concatenate([req.prompt, req.output])
    buf = np.zeros((1, max_model_len), dtype=np.int32)
    buf[0, :len(tokens)] = tokens
    steps, pos, out = [], 1, req.output
    while pos < len(out):
        length = len(req.prompt) + pos
        draft = proposer.propose(k, [[int(out[pos - 1])]], np.array([length]), buf)[0]
        draft = draft[:max(0, max_model_len - length - 1)]  # the scheduler's trim
        accepted = 0
        while accepted < len(draft) and pos + accepted < len(out) \
                and draft[accepted] == out[pos + accepted]:
            accepted += 1
        steps.append((len(draft), accepted))
        pos = min(len(out), pos + accepted + 1)
    return steps


@pytest.mark.parametrize(("k", "lo", "hi"), [(1, 1, 1), (3, 1, 3), (5, 2, 5), (8, 3, 6)])
@pytest.mark.parametrize("max_model_len", [4096, 200])
def test_ngram_replay_is_vllms_proposer_step_for_step(k, lo, hi, max_model_len):
    cap = _capture(seed=k * 10 + lo)
    if max_model_len < 4096:  # long enough contexts run into the max_model_len clamp
        cap = TokenCapture(tuple(r for r in cap.requests
                                 if len(r.prompt) + len(r.output) <= max_model_len))
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
            "prompt_lookup_max": hi}
    got = replay_spec(cap, spec, max_model_len=max_model_len, trace=True)[1]
    for req in cap.level(1, warmup=False):
        want = _ngram_reference(req, k=k, lo=lo, hi=hi, max_model_len=max_model_len)
        assert got.trace[req.index] == want, f"request {req.index} diverges from vLLM"
    assert got.drafts == sum(1 for r in got.trace.values() for d, _ in r if d)
    assert got.full_drafts == sum(1 for r in got.trace.values() for d, _ in r if d == k)
    assert got.uniform_share == pytest.approx(got.full_drafts / got.steps)
    assert got.accepted_tokens == sum(a for r in got.trace.values() for _, a in r)


def test_the_compiled_and_the_stepped_ngram_paths_agree():
    # A one-band schedule [1, any) -> K is the fixed K, but it takes the closed-loop path.
    cap = _capture(seed=3, levels=(1, 3), n=8)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
            "prompt_lookup_max": 4}
    fast = replay_spec(cap, spec, trace=True)
    stepped = replay_spec(cap, {**spec, "num_speculative_tokens_per_batch_size":
                                      [[1, 256, 4]]}, max_num_seqs=256, trace=True)
    for c in (1, 3):
        assert fast[c].trace == stepped[c].trace
        assert fast[c].full_drafts == stepped[c].full_drafts
        assert fast[c].summary() == stepped[c].summary()
        # What the schedule plays out: each request's draft lengths, in index order, on both.
        assert [d.tolist() for d in fast[c].request_drafts] == \
            [d.tolist() for d in stepped[c].request_drafts]
        by_index = [fast[c].trace[i] for i in sorted(fast[c].trace)]
        assert [d.tolist() for d in fast[c].request_drafts] == \
            [[drafted for drafted, _ in steps] for steps in by_index]
        assert [len(d) for d in fast[c].request_drafts] == fast[c].request_steps
        # ... and what each step accepted (the pass shape tuner.replay.streams reads)
        for got in (fast[c], stepped[c]):
            assert [a.tolist() for a in got.request_accepted] == \
                [[accepted for _, accepted in steps] for steps in by_index]
            assert got.request_indices == sorted(fast[c].trace)
            assert got.request_lengths == [len(r.output) for r in sorted(
                cap.level(c, warmup=False), key=lambda r: r.index)]


def test_a_batch_schedule_drafts_the_k_of_the_batch_size():
    cap = _capture(seed=5, levels=(1, 4), n=8, vocab=3)  # small vocab: drafts almost always
    spec = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3, "num_speculative_tokens_per_batch_size": [[1, 2, 5],
                                                                               [3, 256, 2]]}
    got = replay_spec(cap, spec, max_num_seqs=256, trace=True)
    assert max(d for steps in got[1].trace.values() for d, _ in steps) == 5
    # At c=4 every step with 3+ requests drafts at most 2; only the tail runs 1-2 requests.
    wide = [d for steps in got[4].trace.values() for d, _ in steps]
    assert sum(d > 2 for d in wide) < 0.25 * len(wide)
    assert max(wide) <= 5


def test_suffix_learns_across_requests_in_order():
    rng = np.random.default_rng(7)
    text = rng.integers(0, 1000, 150).astype(np.int32)  # large vocab: no repeats by chance
    prompt = rng.integers(0, 1000, 40).astype(np.int32)
    other = rng.integers(0, 1000, 40).astype(np.int32)
    first = RequestTokens(1, 0, False, prompt, text, 150)
    second = RequestTokens(1, 1, False, other, text, 150)  # the same answer to another prompt
    spec = {"method": "suffix", "num_speculative_tokens": 8}
    got = replay_spec(TokenCapture((first, second)), spec, trace=True)[1]
    first_accepted = sum(a for _, a in got.trace[0])
    second_accepted = sum(a for _, a in got.trace[1])
    assert first_accepted <= 5  # nothing to learn from yet
    assert second_accepted > 0.8 * len(text)  # the global tree holds the first answer
    # Alone, the second request learns nothing either: the order is what the cache saw.
    alone = replay_spec(TokenCapture((second,)), spec, trace=True)[1]
    assert sum(a for _, a in alone.trace[1]) <= 5


def test_suffix_replay_is_deterministic_and_counts_like_vllm():
    cap = _capture(seed=11, levels=(1, 2), n=5, vocab=4)
    spec = {"method": "suffix", "num_speculative_tokens": 6,
            "suffix_decoding_max_tree_depth": 16}
    a = replay_spec(cap, spec, trace=True)
    b = replay_spec(cap, spec, trace=True)
    for c in (1, 2):
        assert a[c].trace == b[c].trace
        steps = [s for r in a[c].trace.values() for s in r]
        assert a[c].drafts == sum(1 for d, _ in steps if d)
        assert all(0 <= acc <= d <= 6 for d, acc in steps)
        assert a[c].requests == 5
        # every decode token is one accepted draft token or one bonus token
        assert a[c].output_tokens - a[c].requests == pytest.approx(
            a[c].accepted_tokens + a[c].steps, abs=5)


def test_methods_that_cannot_be_replayed_are_refused():
    with pytest.raises(ValueError, match="cannot be replayed"):
        replay_spec(_capture(seed=1), {"method": "eagle", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="per-batch-size"):
        replay_spec(_capture(seed=1), {"method": "suffix", "num_speculative_tokens": 4,
                                             "num_speculative_tokens_per_batch_size": [[1, 8, 4]]})


def test_k_and_the_engine_limits_come_from_the_config_and_the_caller():
    cap = _capture(seed=1)
    with pytest.raises(ValueError, match="needs num_speculative_tokens"):
        replay_spec(cap, {"method": "ngram", "prompt_lookup_max": 3})
    with pytest.raises(ValueError, match="max_num_seqs"):
        replay_spec(cap, {"method": "ngram", "num_speculative_tokens": 3,
                                "num_speculative_tokens_per_batch_size": [[1, 8, 3]]})
    # suffix: K defaults to the tree depth, as vLLM resolves it (TrialConfig.k)
    depth = replay_spec(cap, {"method": "suffix", "suffix_decoding_max_tree_depth": 6})
    assert {a.k for a in depth.values()} == {6}
    # max_model_len None: no limit, the same as a context longer than every request
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}
    unbounded = replay_spec(cap, spec, trace=True)
    assert {c: a.trace for c, a in unbounded.items()} == {
        c: a.trace for c, a in replay_spec(cap, spec, max_model_len=1 << 20,
                                                 trace=True).items()}


def test_drafts_past_the_end_count_as_vllm_counts_them_in_expectation():
    # The output repeats its prompt: every draft is accepted, the last one runs past the end.
    prompt = np.arange(100, 140, dtype=np.int32)
    req = RequestTokens(1, 0, False, prompt, prompt[:22].copy(), max_tokens=22)
    spec = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
            "prompt_lookup_max": 3}
    got = replay_spec(TokenCapture((req,)), spec, trace=True)[1]
    assert got.past_end and got.past_end[0] >= 1
    assert got.continuation_rate == pytest.approx(1.0)  # every accepted position continued
    assert got.expected_past_end == pytest.approx(got.past_end[0])
    assert got.acceptance_length == pytest.approx(
        1 + (got.accepted_tokens + got.past_end[0]) / got.drafts)
    stepped = replay_spec(TokenCapture((req,)), {
        **spec, "num_speculative_tokens_per_batch_size": [[1, 8, 5]]}, max_num_seqs=8)[1]
    assert stepped.past_end == got.past_end
