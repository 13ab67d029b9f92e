"""Why the replay holds at temperature > 0, checked without vLLM, and its sampling error.

A known next-token distribution (a Markov chain over 20 tokens whose likeliest successor
repeats in short cycles, so an n-gram lookup drafts often) generates (a) plain sampled streams and
(b) speculative runs where a point-mass n-gram draft is verified with the lossless rule of
vLLM's rejection sampler for drafts without probabilities: accept d with probability p(d), on
rejection sample from p without d, a bonus token after a full acceptance. Stepping the same
proposer over plain streams (the replay's counting) must give the speculative run's acceptance
within sampling error; a sampler that accepts the argmax greedily must be told apart
(tuner.replay.sampling.mismatch). Then the bootstrap half-width of tuner.replay.sampling:
covers another run, and the truth, at about the stated 90%.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tuner.records.predictions import PredictedFigure, PredictedRow
from tuner.replay import sampling
from tuner.replay.acceptance import Acceptance

VOCAB, K, PROMPT, OUTPUT, REQUESTS = 20, 3, 12, 48, 300


@pytest.fixture(scope="module")
def chain() -> np.ndarray:
    """p(next | token): 0.7 on a successor that cycles through blocks of 5 tokens, the rest
    spread at random."""
    rng = np.random.default_rng(7)
    t = np.arange(VOCAB)
    successor = t // 5 * 5 + (t + 1) % 5
    p = rng.dirichlet(np.ones(VOCAB), size=VOCAB) * 0.3
    p[np.arange(VOCAB), successor] += 0.7
    return p / p.sum(axis=1, keepdims=True)


def _propose(ctx: list[int], k: int) -> list[int]:
    """Prompt lookup: the tokens after the latest earlier match of the last 3 (else 2, 1)."""
    for n in (3, 2, 1):
        tail = ctx[-n:]
        for j in range(len(ctx) - n - 1, -1, -1):
            if ctx[j:j + n] == tail:
                return ctx[j + n:j + n + k]
    return []


def _draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from the distribution p."""
    return min(int(np.searchsorted(np.cumsum(p), rng.random() * p.sum())), len(p) - 1)


def _prompt(chain: np.ndarray, rng: np.random.Generator) -> list[int]:
    ctx = [int(rng.integers(VOCAB))]
    while len(ctx) < PROMPT:
        ctx.append(_draw(chain[ctx[-1]], rng))
    return ctx


def _plain(chain: np.ndarray, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    prompt = _prompt(chain, rng)
    ctx = list(prompt)
    while len(ctx) < PROMPT + OUTPUT:
        ctx.append(_draw(chain[ctx[-1]], rng))
    return prompt, ctx[PROMPT:]


def _record(acc: Acceptance, drafted: list[int], accepted: list[int]) -> None:
    d, a = np.array(drafted, np.int16), np.array(accepted, np.int16)
    acc._count_many(d, a)
    acc.request_drafts.append(d)
    acc.request_accepted.append(a)
    acc.request_lengths.append(OUTPUT)
    acc.requests += 1
    acc.output_tokens += OUTPUT


def _replay(streams: list[tuple[list[int], list[int]]]) -> Acceptance:
    """The replay's counting: the proposer stepped over recorded streams (accepted + 1 a step;
    no draft past the last token, as in the speculative run below)."""
    acc = Acceptance(concurrency=1, k=K)
    for prompt, out in streams:
        drafted, accepted, pos = [], [], 1  # the prefill emitted out[0]
        while pos < OUTPUT:
            draft = _propose(prompt + out[:pos], min(K, OUTPUT - pos - 1))
            a = 0
            while a < len(draft) and draft[a] == out[pos + a]:
                a += 1
            drafted.append(len(draft))
            accepted.append(a)
            pos += a + 1
        _record(acc, drafted, accepted)
    return acc


def _speculative(chain: np.ndarray, rng: np.random.Generator, *, greedy: bool = False
                 ) -> Acceptance:
    """An engine verifying point-mass drafts: lossless rule, or (greedy) the argmax accepted."""
    acc = Acceptance(concurrency=1, k=K)
    for _ in range(REQUESTS):
        ctx = _prompt(chain, rng)
        ctx.append(_draw(chain[ctx[-1]], rng))
        drafted, accepted = [], []
        while len(ctx) < PROMPT + OUTPUT:
            draft = _propose(ctx, min(K, PROMPT + OUTPUT - len(ctx) - 1))
            a = 0
            for d in draft:
                p = chain[ctx[-1]]
                ok = d == int(np.argmax(p)) if greedy else rng.random() < p[d]
                if not ok:
                    rest = p.copy()
                    rest[d] = 0.0
                    ctx.append(_draw(rest, rng))  # renormalised by _draw
                    break
                ctx.append(d)
                a += 1
            else:
                ctx.append(_draw(chain[ctx[-1]], rng))  # the bonus token
            drafted.append(len(draft))
            accepted.append(a)
        _record(acc, drafted, accepted)
    return acc


def _length_and_se(acc: Acceptance) -> tuple[float, float]:
    """Acceptance length (1 + accepted / drafts) and its standard error over requests."""
    a = np.array([x.sum() for x in acc.request_accepted], float)
    d = np.array([(x > 0).sum() for x in acc.request_drafts], float)
    ratio = a.sum() / d.sum()
    return 1 + ratio, math.sqrt(((a - ratio * d) ** 2).sum()) / d.sum()


@pytest.fixture(scope="module")
def runs(chain):
    rng = np.random.default_rng(11)
    plain = _replay([_plain(chain, rng) for _ in range(REQUESTS)])
    return plain, _speculative(chain, rng), _speculative(chain, rng, greedy=True)


def test_the_replay_over_plain_streams_counts_the_speculative_runs_acceptance(runs):
    plain, lossless, _ = runs
    assert plain.drafts / plain.steps > 0.5  # the proposer drafts on most steps
    (x, sx), (y, sy) = _length_and_se(plain), _length_and_se(lossless)
    assert abs(x - y) < 4 * math.hypot(sx, sy), (x, y, sx, sy)
    # ... and the acceptance rate, and the draft length, agree as well
    assert plain.acceptance_rate == pytest.approx(lossless.acceptance_rate, abs=0.03)
    assert plain.drafted_per_step == pytest.approx(lossless.drafted_per_step, rel=0.05)
    row = _row(plain, measured=lossless.acceptance_length)
    assert not sampling.mismatch(row, temperature=0.8)


def test_a_sampler_that_accepts_the_argmax_greedily_is_told_apart(runs):
    plain, _, greedy = runs
    (x, sx), (y, sy) = _length_and_se(plain), _length_and_se(greedy)
    assert abs(x - y) > 4 * math.hypot(sx, sy), (x, y, sx, sy)
    row = _row(plain, measured=greedy.acceptance_length)
    assert sampling.mismatch(row, temperature=0.8)
    assert not sampling.mismatch(row, temperature=0.0)  # greedy: the replay is exact there
    line = sampling.mismatch_line(row, temperature=0.8, vllm_version="0.32.0", device="cpu")
    assert line.startswith("vLLM 0.32.0 (cpu) accepted ")
    assert "vLLM #55005" in line and line.endswith("reflect this build, not the method.")


def _row(acc: Acceptance, *, measured: float | None = None) -> PredictedRow:
    row = PredictedRow(key="k3", label="ngram k3", method="ngram", concurrency=1,
                       speculative_config='{"method":"ngram"}',
                       acceptance_length=acc.acceptance_length,
                       acceptance_rate=acc.acceptance_rate, pred_output_throughput=100.0,
                       pred_mean_tpot_ms=20.0, meas_acceptance_length=measured)
    return sampling.with_spread(row, acc, temperature=0.8)


# --- the bootstrap half-width ---------------------------------------------------------------
def _synthetic(rng: np.random.Generator, n: int) -> Acceptance:
    """n requests of 5-30 verify steps, 1 in 5 without a draft, each request with its own
    chance (Beta(4, 3)) of accepting a drafted position once the one before it was."""
    acc = Acceptance(concurrency=1, k=K)
    for _ in range(n):
        steps, q = int(rng.integers(5, 31)), rng.beta(4, 3)
        drafted = np.where(rng.random(steps) < 0.2, 0, K).astype(np.int16)
        runs_ = np.minimum(rng.geometric(1 - q, steps) - 1, K)
        accepted = np.where(drafted > 0, runs_, 0).astype(np.int16)
        acc._count_many(drafted, accepted)
        acc.request_drafts.append(drafted)
        acc.request_accepted.append(accepted)
        acc.request_lengths.append(int(steps + accepted.sum() + 1))
        acc.requests += 1
        acc.output_tokens += acc.request_lengths[-1]
    return acc


def test_the_half_width_covers_another_run_and_the_truth_at_about_90_percent():
    rng = np.random.default_rng(3)
    # 1 + E[accepted per drafting step] = 1 + sum over j <= K of E[q^j], q ~ Beta(4, 3)
    truth = 1 + sum(math.prod((4 + r) / (7 + r) for r in range(j)) for j in range(1, K + 1))
    other = truth_hit = 0
    sims = 300
    for _ in range(sims):
        capture, measured = _synthetic(rng, 40), _synthetic(rng, 40)
        half = sampling.spread(capture).acceptance_length
        other += abs(measured.acceptance_length - capture.acceptance_length) <= half
        # Without the measured run's own error (sqrt(2)), it is an interval for the truth.
        truth_hit += abs(truth - capture.acceptance_length) <= half / math.sqrt(2)
    assert 0.83 <= other / sims <= 0.96, other / sims
    assert 0.83 <= truth_hit / sims <= 0.96, truth_hit / sims


def test_no_half_width_at_temperature_0_nor_for_the_baseline():
    acc = _synthetic(np.random.default_rng(5), 30)
    row = PredictedRow(key="k", label="k", method="ngram", concurrency=1,
                       speculative_config='{"method":"ngram"}', pred_output_throughput=100.0,
                       pred_mean_tpot_ms=20.0)

    def half_widths(r: PredictedRow) -> list[float | None]:
        return [getattr(r, c) for c in sampling.PM_COLUMNS]

    assert half_widths(sampling.with_spread(row, acc, temperature=0.0)) == [None] * 4
    assert half_widths(sampling.with_spread(dataclasses.replace(row, speculative_config=""),
                                            acc, temperature=0.8)) == [None] * 4
    sampled = sampling.with_spread(row, acc, temperature=0.8)
    assert all(v is not None and v > 0 for v in half_widths(sampled))
    # throughput and TPOT carry the same relative half-width (tokens per step)
    assert sampled.pred_output_throughput_pm / 100.0 == \
        pytest.approx(sampled.pred_mean_tpot_ms_pm / 20.0)
    assert sampling.spread(_synthetic(np.random.default_rng(5), 1)) is None


def test_the_same_resamples_give_the_same_half_width_and_more_requests_a_narrower_one():
    rng = np.random.default_rng(9)
    small, large = _synthetic(rng, 50), _synthetic(rng, 800)
    assert sampling.spread(small) == sampling.spread(small)
    assert sampling.spread(large).acceptance_length < sampling.spread(small).acceptance_length


def test_leaders_within_the_best_interval_are_told():
    def row(thr: float, pm: float | None) -> PredictedRow:
        return PredictedRow(key="k", label="k", method="ngram", concurrency=1,
                            pred_output_throughput=thr, pred_output_throughput_pm=pm)

    best = row(100.0, 3.0)
    assert sampling.within(row(95.0, 2.5), best)
    assert not sampling.within(row(90.0, 2.0), best)
    # at temperature 0 there is no interval: nothing is tied
    assert not sampling.within(row(99.9, None), best)
    # by TPOT: the TPOT's own half-widths (none here)
    assert not sampling.within(row(95.0, 2.5), best, PredictedFigure.MEAN_TPOT)
