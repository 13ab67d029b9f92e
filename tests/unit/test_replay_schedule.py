"""The closed loop played out over engine steps (tuner.replay.schedule), against hand-worked
timelines."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.replay import schedule


def _line(a: float, b: float, m: float = 0.0):
    return lambda n, u: a + b * n + m * u


def test_a_hand_worked_closed_loop():
    # c=2, three requests of 3, 5 and 3 tokens, no speculation, step = 10 + 2 n ms:
    # t=0 both prefilled (no decoders: 10 ms); steps of two at 14 ms until r0 ends at 38;
    # r2 sent at 38 and prefilled beside r1 (12 ms); r1 ends at 64, r2 at 76.
    lengths = [3, 5, 3]
    got = schedule.simulate(schedule.baseline_drafts(lengths), lengths, concurrency=2, k=0,
                            step_ms=_line(10, 2))
    assert got.duration_ms == pytest.approx(76.0)
    assert got.ttft_ms == pytest.approx((10.0, 10.0, 12.0))
    assert got.tpot_ms == pytest.approx((14.0, 13.5, 13.0))
    assert (got.coef_a, got.coef_b) == pytest.approx((1.0, 1.75))
    assert got.output_throughput == pytest.approx(1000.0 * 11 / 76.0)
    assert got.uniform_share == 1.0  # no speculation: every step is uniform


def test_a_ragged_level_outlasts_its_mean_latency():
    # One request of four needs many more steps than the rest (it drafted little): the last
    # part of the level runs it alone, so the level lasts longer than sum(latency) / c.
    drafts = [np.zeros(40, np.int16), np.full(8, 4, np.int16), np.full(8, 4, np.int16),
              np.full(8, 4, np.int16)]
    lengths = [41, 41, 41, 41]
    got = schedule.simulate(drafts, lengths, concurrency=4, k=4, step_ms=_line(10, 1))
    busy = [t * (n - 1) for t, n in zip(got.tpot_ms, lengths, strict=True)]
    assert got.duration_ms > 1.5 * (sum(busy) + sum(got.ttft_ms)) / 4


def test_prefills_stall_the_running_requests_and_the_fit_coefficients_add_up():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 30, 12).tolist()
    drafts = [rng.choice([0, 2, 3], size=rng.integers(1, n)).astype(np.int16) for n in lengths]
    prompts = rng.integers(20, 200, 12).tolist()
    a, b, m, q = 7.0, 0.5, 3.0, 0.04
    got = schedule.simulate(drafts, lengths, concurrency=3, k=3, step_ms=_line(a, b, m),
                            prompts=prompts, prefill_ms_per_token=q, overhead_ms=5.0)
    assert got.stall_ms > 0  # later requests were prefilled while others decoded
    # decode time per token = a coef_a + b coef_b + m coef_m + stalls: what the cost fit
    # inverts; it is sum(e2e - TTFT) / sum(N - 1), each request weighed by its tokens
    assert got.decode_ms_per_token == pytest.approx(a * got.coef_a + b * got.coef_b
                                                    + m * got.coef_m + got.stall_ms)
    per = [n - 1 for n in lengths if n > 1]
    assert got.decode_ms_per_token == pytest.approx(
        sum(t * n for t, n in zip(got.tpot_ms, per, strict=True)) / sum(per))
    assert 0.0 < got.uniform_share < 1.0
    free = schedule.simulate(drafts, lengths, concurrency=3, k=3, step_ms=_line(a, b, m),
                             prompts=prompts, prefill_ms_per_token=0.0, overhead_ms=5.0)
    assert free.stall_ms == 0.0 and free.duration_ms < got.duration_ms


def test_the_first_token_waits_for_the_frontend_and_its_own_prefill():
    got = schedule.simulate([np.zeros(3, np.int16)], [4], concurrency=1, k=0,
                            step_ms=_line(10, 1), prompts=[100], prefill_ms_per_token=0.5,
                            overhead_ms=20.0)
    assert got.ttft_ms == pytest.approx((20.0 + 10.0 + 50.0,))  # o + a + q P
    assert got.tpot_ms == pytest.approx((11.0,))


def test_uniform_steps_are_those_where_every_request_drafted_k():
    drafts = [np.array([2, 2], np.int16), np.array([2, 0], np.int16)]
    got = schedule.simulate(drafts, [5, 4], concurrency=2, k=2, step_ms=_line(1, 0))
    assert (got.steps, got.uniform_steps) == (2, 1)
    with pytest.raises(ValueError, match="2 draft traces for 3 requests"):
        schedule.simulate(drafts, [5, 4, 3], concurrency=2, k=2, step_ms=_line(1, 0))
