"""tuner/measure/metrics.py: Prometheus parsing, counter deltas, percentiles and the level definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.measure import metrics
from tuner.records import RequestRecord, SpecDecodeCounts

# Two engines (data parallel), prometheus_client's exposition with HELP/TYPE and _created lines.
SCRAPE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 30.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7331e+09
vllm:spec_decode_num_drafts_created{engine="1",model_name="m"} 1.7331e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 90.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 48.0
vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="m"} 1.7331e+09
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 28.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="0"} 1.7e9
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:generation_tokens_total{engine="0",model_name="m"} 9999.0
"""


def test_parse_sums_engines_and_ignores_created_and_other_metrics() -> None:
    c = metrics.parse_spec_counters(SCRAPE)
    assert c.num_drafts == 40.0
    assert c.num_draft_tokens == 120.0
    assert c.num_accepted_tokens == 60.0
    assert c.accepted_per_pos == (36.0, 18.0, 6.0)


def test_parse_accepts_names_without_total_suffix_and_positions_out_of_order() -> None:
    text = ('vllm:spec_decode_num_drafts{model_name="m"} 5\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos{position="2"} 1\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos{position="0"} 4\n')
    c = metrics.parse_spec_counters(text)
    assert c.num_drafts == 5.0
    # A position nobody reported is a zero, not a shorter tuple.
    assert c.accepted_per_pos == (4.0, 0.0, 1.0)


def test_parse_without_speculation_is_all_zero() -> None:
    c = metrics.parse_spec_counters('vllm:num_requests_running{engine="0"} 1\n# EOF\n')
    assert c == SpecDecodeCounts()


def test_parse_tolerates_timestamps_and_garbage_values() -> None:
    text = ('vllm:spec_decode_num_drafts_total{engine="0"} 7 1733150000000\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0"} NaNish\n')
    c = metrics.parse_spec_counters(text)
    assert c.num_drafts == 7.0
    assert c.num_draft_tokens == 0.0


def test_delta_subtracts_and_pads_positions() -> None:
    before = SpecDecodeCounts(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12,
                              accepted_per_pos=(8.0, 3.0))
    after = SpecDecodeCounts(num_drafts=40, num_draft_tokens=120, num_accepted_tokens=60,
                             accepted_per_pos=(36.0, 18.0, 6.0))
    d = metrics.delta(before, after)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (30, 90, 48)
    assert d.accepted_per_pos == (28.0, 15.0, 6.0)


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 99.9, 100])
@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0],
                                    [0.1 * i * i for i in range(37)]])
def test_percentile_matches_numpy_default(values: list[float], q: float) -> None:
    assert metrics.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
       st.floats(0, 100))
def test_percentile_matches_numpy_property(values: list[float], q: float) -> None:
    assert metrics.percentile(values, q) == pytest.approx(float(np.percentile(values, q)),
                                                          rel=1e-9, abs=1e-6)


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(metrics.percentile([], 50))


def _rec(index: int, *, ttft: float | None = 0.1, e2e: float | None = 1.0, out: int = 10,
         prompt: int = 5, warmup: bool = False, error: str | None = None,
         gaps: tuple[float, ...] = ()) -> RequestRecord:
    return RequestRecord(concurrency=2, index=index, warmup=warmup, start_s=0.0, ttft_s=ttft,
                         e2e_s=e2e, prompt_tokens=prompt, output_tokens=out,
                         chunk_gaps_s=gaps, error=error)


def test_tpot_is_decode_time_over_tokens_after_the_first() -> None:
    assert _rec(0, ttft=0.1, e2e=1.0, out=10).tpot_s == pytest.approx(0.1)
    assert _rec(0, out=1).tpot_s is None  # one token: no decode interval
    assert _rec(0, error="HTTP 500").tpot_s is None


def test_level_metrics_definitions() -> None:
    records = [
        _rec(0, ttft=0.1, e2e=1.0, out=10, gaps=(0.3, 0.6)),   # TPOT 100 ms
        _rec(1, ttft=0.2, e2e=0.8, out=4, gaps=(0.6,)),        # TPOT 200 ms
        _rec(2, ttft=None, e2e=None, out=0, error="HTTP 500: boom"),
        _rec(3, ttft=5.0, e2e=9.0, out=100, warmup=True),      # warm-up: never counted
    ]
    lv = metrics.level_metrics(records, concurrency=2, duration_s=2.0, warmup_requests=1,
                               counts=SpecDecodeCounts())
    assert (lv.num_requests, lv.completed, lv.failed, lv.warmup_requests) == (3, 2, 1, 1)
    assert lv.total_output_tokens == 14 and lv.total_input_tokens == 10
    assert lv.output_throughput == pytest.approx(14 / 2.0)
    assert lv.request_throughput == pytest.approx(2 / 2.0)
    assert lv.total_token_throughput == pytest.approx(24 / 2.0)
    assert lv.mean_ttft_ms == pytest.approx(150.0)
    assert lv.mean_tpot_ms == pytest.approx(150.0)
    assert lv.median_tpot_ms == pytest.approx(150.0)
    assert lv.p99_tpot_ms == pytest.approx(float(np.percentile([100.0, 200.0], 99)))
    assert lv.std_tpot_ms == pytest.approx(50.0)
    # Chunk gaps are reported as ITL, pooled over requests, never used as TPOT.
    assert lv.mean_itl_ms == pytest.approx(500.0)
    assert lv.mean_e2el_ms == pytest.approx(900.0)
    assert lv.errors == ("HTTP 500: boom",)
    assert lv.spec_decode_acceptance_rate is None
    assert lv.spec_decode_acceptance_length is None
    assert lv.spec_decode_per_position_acceptance_rates == ()


def test_tpot_is_not_chunk_itl_under_speculation() -> None:
    # 3 tokens per chunk: 1 + 3 * 10 tokens, chunks every 30 ms -> TPOT 10 ms, ITL 30 ms.
    rec = _rec(0, ttft=0.05, e2e=0.05 + 10 * 0.03, out=31, gaps=(0.03,) * 10)
    lv = metrics.level_metrics([rec], concurrency=1, duration_s=1.0, warmup_requests=0,
                               counts=SpecDecodeCounts())
    assert lv.mean_tpot_ms == pytest.approx(10.0)
    assert lv.mean_itl_ms == pytest.approx(30.0)


def test_level_metrics_all_failed_gives_nan_latencies_and_zero_throughput() -> None:
    lv = metrics.level_metrics([_rec(0, ttft=None, e2e=None, out=0, error="timed out")],
                               concurrency=1, duration_s=3.0, warmup_requests=0,
                               counts=SpecDecodeCounts())
    assert lv.failed == 1 and lv.completed == 0
    assert lv.output_throughput == 0.0
    assert math.isnan(lv.mean_ttft_ms) and math.isnan(lv.mean_tpot_ms)


def test_acceptance_formulas_follow_vllm() -> None:
    # vLLM: rate = accepted / draft tokens; mean length = 1 + accepted / drafts;
    # per position = accepted at that position / drafts.
    counts = SpecDecodeCounts(num_drafts=30, num_draft_tokens=90, num_accepted_tokens=48,
                              accepted_per_pos=(28.0, 15.0, 5.0))
    lv = metrics.level_metrics([_rec(0)], concurrency=1, duration_s=1.0, warmup_requests=0,
                               counts=counts)
    assert lv.spec_decode_acceptance_rate == pytest.approx(48 / 90)
    assert lv.spec_decode_acceptance_length == pytest.approx(1 + 48 / 30)
    assert lv.spec_decode_per_position_acceptance_rates == pytest.approx((28 / 30, 15 / 30, 5 / 30))
    assert lv.spec_decode_num_drafts == 30


def test_acceptance_from_scrape_delta_end_to_end() -> None:
    before = metrics.parse_spec_counters(SCRAPE)
    after = metrics.parse_spec_counters(SCRAPE.replace(" 10.0\n", " 20.0\n")
                                        .replace('"0",model_name="m"} 30.0', '"0",model_name="m"} 60.0')
                                        .replace('"0",model_name="m"} 12.0', '"0",model_name="m"} 27.0'))
    d = metrics.delta(before, after)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (10, 30, 15)
    lv = metrics.level_metrics([_rec(0)], concurrency=1, duration_s=1.0, warmup_requests=0,
                               counts=d)
    assert lv.spec_decode_acceptance_rate == pytest.approx(0.5)
    assert lv.spec_decode_acceptance_length == pytest.approx(2.5)
