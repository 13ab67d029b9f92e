"""The K axis of a model-based drafter from one launch (tuner/replay/drafter_k.py): the
acceptance at K from per-position rates and its standard error from the counts, the drafter's
step cost from one launch and from two, and the axis against launches of a known truth."""

from __future__ import annotations

import math
import random

import pytest

from tuner.records.configs import TrialConfig
from tuner.records.drafter_k import KLaunch, KLevel
from tuner.replay import drafter_k

RATES = tuple(0.8 ** i for i in range(1, 6))  # geometric: each position accepted at 0.8 given the last
DRAFT = TrialConfig(speculative_config={"method": "draft_model", "model": "/m/draft",
                                        "num_speculative_tokens": 5})


def test_acceptance_at_the_launched_k_is_one_plus_its_rates_and_its_se_the_counts_spread() -> None:
    length, se = drafter_k.acceptance_at(RATES[:3], 3, drafts=400)
    assert length == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    # The capped accepted count's distribution, written out: P(A = j) = r_j - r_{j+1}.
    r = [1.0, *RATES[:3], 0.0]
    probs = {j: r[j] - r[j + 1] for j in range(4)}
    mean = sum(j * p for j, p in probs.items())
    var = sum(j * j * p for j, p in probs.items()) - mean ** 2
    assert se == pytest.approx(math.sqrt(var / 400))


def test_the_se_holds_the_spread_of_drawn_drafts() -> None:
    # 2,000 launches of 300 drafts each, drawn as the fake engine draws them: the spread of
    # their mean accepted count at K=4 is the stated SE (within 5%).
    rng = random.Random(7)
    means = []
    for _ in range(2000):
        total = 0
        for _ in range(300):
            accepted, before = 0, 1.0
            for rate in RATES[:4]:
                if rng.random() >= rate / before:
                    break
                accepted, before = accepted + 1, rate
            total += accepted
        means.append(total / 300)
    mu = sum(means) / len(means)
    sd = math.sqrt(sum((m - mu) ** 2 for m in means) / (len(means) - 1))
    _, se = drafter_k.acceptance_at(RATES[:4], 4, drafts=300)
    assert sd == pytest.approx(se, rel=0.05)
    assert mu == pytest.approx(sum(RATES[:4]), abs=3 * se / math.sqrt(len(means)))


# A drafter whose agreement is not memoryless: after a correction it agrees for a length l
# with P(l >= i) = FRESH[i-1], beyond at 0.85 per token (long runs of boilerplate).
FRESH = (0.7, 0.5, 0.4, 0.34, 0.29)
FRESH_TAIL = 0.85


def _agreement(rng: random.Random) -> int:
    length, before = 0, 1.0
    for rate in FRESH:
        if rng.random() >= rate / before:
            return length
        length, before = length + 1, rate
    while rng.random() < FRESH_TAIL:
        length += 1
    return length


def _stepped(agreements: list[int], k: int) -> tuple[list[int], int, int]:
    """A launch at K over these agreements, step by step as vLLM runs it: its drafts'
    accepted counts per position (position i accepted in how many drafts), its drafts and
    its tokens. A step accepts min(left, K); where left > K the next step starts inside the
    agreement with left - K - 1 left, else after the correction with a fresh one."""
    per_pos, drafts, tokens = [0] * k, 0, 0
    for length in agreements:
        left = length
        while True:
            accepted = min(left, k)
            drafts += 1
            tokens += accepted + 1
            for pos in range(accepted):
                per_pos[pos] += 1
            if left <= k:
                break
            left -= k + 1
    return per_pos, drafts, tokens


def test_one_launch_at_k_max_gives_every_smaller_k_where_the_agreement_carries_over() -> None:
    # 200,000 segments stepped through at K=5, and at each smaller K: the acceptance length
    # predicted from the K=5 launch's rates is the stepped truth (within the simulation's
    # noise), where one plus the first K rates falls short (1.4-3.0% here).
    rng = random.Random(11)
    agreements = [_agreement(rng) for _ in range(200_000)]
    per_pos, drafts, _ = _stepped(agreements, 5)
    rates = tuple(n / drafts for n in per_pos)
    for k in (1, 2, 3, 4):
        _, k_drafts, k_tokens = _stepped(agreements, k)
        truth = k_tokens / k_drafts
        length, _ = drafter_k.acceptance_at(rates, k, drafts)
        assert length == pytest.approx(truth, rel=0.003), k
        assert 1 + sum(rates[:k]) < truth * 0.99, k  # starting every step afresh


def test_the_se_at_a_smaller_k_holds_the_spread_of_launches() -> None:
    # 600 launches of 400 segments each at K=5: the spread of their predictions at K=2 is the
    # SE each states (within 12%), and their mean the truth.
    rng = random.Random(5)
    predictions, ses = [], []
    for _ in range(600):
        per_pos, drafts, _ = _stepped([_agreement(rng) for _ in range(400)], 5)
        length, se = drafter_k.acceptance_at(tuple(n / drafts for n in per_pos), 2, drafts)
        predictions.append(length)
        ses.append(se)
    mu = sum(predictions) / len(predictions)
    sd = math.sqrt(sum((x - mu) ** 2 for x in predictions) / (len(predictions) - 1))
    assert sd == pytest.approx(sum(ses) / len(ses), rel=0.12)
    rng = random.Random(9)
    _, k_drafts, k_tokens = _stepped([_agreement(rng) for _ in range(100_000)], 2)
    assert mu == pytest.approx(k_tokens / k_drafts, rel=0.01)


def test_k_beyond_the_launched_positions_is_refused() -> None:
    with pytest.raises(ValueError, match="K=6 outside the launched positions 1-5"):
        drafter_k.acceptance_at(RATES, 6, drafts=10)


def test_one_launch_fits_the_slope_through_the_baseline_and_says_it_is_not_calibrated() -> None:
    cost = drafter_k.fit_cost(1, 20.0, [(5, 45.0)])
    assert (cost.fixed_ms, cost.per_token_ms, cost.calibrated) == (0.0, 5.0, False)
    assert cost.step_ms(0) == 20.0 and cost.step_ms(2) == 30.0


def test_a_second_k_fits_the_fixed_cost_too() -> None:
    cost = drafter_k.fit_cost(4, 20.0, [(5, 20.0 + 6.0 + 4.0 * 5), (1, 20.0 + 6.0 + 4.0)],
                              verify_ms_per_token=1.5)
    assert cost.calibrated and cost.fitted_on_k == (1, 5)
    assert cost.fixed_ms == pytest.approx(6.0) and cost.per_token_ms == pytest.approx(4.0)
    assert cost.drafter_ms_per_token == pytest.approx(2.5)


def _level(c: int, k: int, *, base_ms: float, fixed: float, per: float, ttft: float = 30.0,
           tokens: float = 64.0) -> KLevel:
    """What a launch at K measures where the truth is step = base + fixed + per K and the
    rates RATES (drafts enough that the counts are the rates)."""
    length = 1 + sum(RATES[:k]) if k else 1.0
    step = base_ms + (fixed + per * k if k else 0.0)
    dpt = step / length
    thr = 1000.0 * tokens * c / (ttft + (tokens - 1) * dpt)
    return KLevel(concurrency=c, drafts=500.0 if k else 0.0, per_position=RATES[:k],
                  acceptance_length=length, decode_ms_per_token=dpt, output_throughput=thr,
                  mean_ttft_ms=ttft, mean_tpot_ms=dpt, tokens_per_request=tokens)


def _launch(k: int, truth: dict[int, tuple[float, float, float]]) -> KLaunch:
    return KLaunch(number=k, k=k, key=DRAFT.with_k(k).key(), levels=tuple(
        _level(c, k, base_ms=b, fixed=f, per=p) for c, (b, f, p) in truth.items()))


TRUTH = {1: (20.0, 6.0, 4.0), 4: (28.0, 9.0, 7.0)}  # level -> base, fixed, per-token ms


def test_a_second_launch_predicts_every_k_of_a_known_truth_exactly() -> None:
    base = {c: _level(c, 0, base_ms=b, fixed=0, per=0) for c, (b, _, _) in TRUTH.items()}
    launched = {k: _launch(k, TRUTH) for k in (5, 1, 2, 3)}
    ax = drafter_k.axis(DRAFT, list(launched.values()), base)
    assert ax.source_k == 5 and ax.calibrated and ax.launched_k == (1, 2, 3, 5)
    assert [(p.concurrency, p.k) for p in ax.points] == [(c, k) for c in (1, 4)
                                                         for k in range(1, 6)]
    for p in ax.points:
        truth = _level(p.concurrency, p.k, base_ms=TRUTH[p.concurrency][0],
                       fixed=TRUTH[p.concurrency][1], per=TRUTH[p.concurrency][2])
        assert p.acceptance_length == pytest.approx(truth.acceptance_length)
        assert p.output_throughput == pytest.approx(truth.output_throughput)
        assert p.fitted == (p.k in (1, 5)) and p.source == (p.k == 5)
        assert not p.acceptance_miss and not p.throughput_miss
    assert ax.misses() == []


def test_one_launch_misses_what_the_fixed_cost_leaves_out_and_says_so() -> None:
    base = {c: _level(c, 0, base_ms=b, fixed=0, per=0) for c, (b, _, _) in TRUTH.items()}
    ax = drafter_k.axis(DRAFT, [_launch(5, TRUTH), _launch(1, {1: TRUTH[1]})], base)
    # Only c=1 has the second K: c=4 rests on one launch.
    assert {c.concurrency: c.calibrated for c in ax.costs} == {1: True, 4: False}
    one = drafter_k.axis(DRAFT, [_launch(5, TRUTH)], base)
    assert not one.calibrated
    k1 = next(p for p in one.points if p.concurrency == 4 and p.k == 1)
    truth = _level(4, 1, base_ms=28.0, fixed=9.0, per=7.0)
    # step(1) predicted 28 + (9 + 35) / 5 = 36.8 ms against 44 ms: throughput over-predicted.
    assert k1.step_ms == pytest.approx(36.8)
    assert k1.output_throughput > truth.output_throughput * 1.05


def test_a_launch_whose_acceptance_misses_beyond_the_counts_is_a_miss() -> None:
    base = {1: _level(1, 0, base_ms=20.0, fixed=0, per=0)}
    src = _launch(5, {1: TRUTH[1]})
    lv = _level(1, 2, base_ms=20.0, fixed=6.0, per=4.0)
    off = KLaunch(number=9, k=2, key=DRAFT.with_k(2).key(), levels=(
        KLevel(**{**lv.__dict__, "acceptance_length": lv.acceptance_length * 0.9}),))
    ax = drafter_k.axis(DRAFT, [src, off], base)
    k2 = next(p for p in ax.points if p.k == 2)
    assert k2.err_acceptance_length_pct == pytest.approx(100 / 0.9 - 100)
    # 500 drafts each side: three SEs of the difference are 5.7% of the length, above the floor.
    se = drafter_k.acceptance_at(RATES, 2, drafts=500)[1]
    meas_se = drafter_k.acceptance_at(RATES[:2], 2, drafts=500)[1]
    assert k2.acceptance_accuracy_pct == pytest.approx(
        max(drafter_k.ACCEPTANCE_FLOOR_PCT,
            100 * 3 * math.hypot(se, meas_se) / k2.acceptance_length))
    assert 5.5 < k2.acceptance_accuracy_pct < 6
    assert k2.acceptance_miss and ax.misses() == [k2]
