"""tuner/measure/metrics.py: Prometheus parsing, counter deltas, percentiles and the level definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.measure import metrics
from tuner.records.results import LevelMetrics, RequestRecord, SpecDecodeCounts

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
    # vLLM: rate = 100 * accepted / draft tokens (a percentage in its bench results);
    # mean length = 1 + accepted / drafts; per position = accepted at that position / drafts.
    counts = SpecDecodeCounts(num_drafts=30, num_draft_tokens=90, num_accepted_tokens=48,
                              accepted_per_pos=(28.0, 15.0, 5.0))
    lv = metrics.level_metrics([_rec(0)], concurrency=1, duration_s=1.0, warmup_requests=0,
                               counts=counts)
    assert lv.spec_decode_acceptance_rate == pytest.approx(100 * 48 / 90)
    assert lv.spec_decode_acceptance_length == pytest.approx(1 + 48 / 30)
    assert lv.spec_decode_per_position_acceptance_rates == pytest.approx((28 / 30, 15 / 30, 5 / 30))
    assert lv.spec_decode_num_drafts == 30
    assert (lv.spec_decode_draft_tokens, lv.spec_decode_accepted_tokens) == (90, 48)


def test_acceptance_from_scrape_delta_end_to_end() -> None:
    before = metrics.parse_spec_counters(SCRAPE)
    after = metrics.parse_spec_counters(SCRAPE.replace(" 10.0\n", " 20.0\n")
                                        .replace('"0",model_name="m"} 30.0', '"0",model_name="m"} 60.0')
                                        .replace('"0",model_name="m"} 12.0', '"0",model_name="m"} 27.0'))
    d = metrics.delta(before, after)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (10, 30, 15)
    lv = metrics.level_metrics([_rec(0)], concurrency=1, duration_s=1.0, warmup_requests=0,
                               counts=d)
    assert lv.spec_decode_acceptance_rate == pytest.approx(50.0)
    assert lv.spec_decode_acceptance_length == pytest.approx(2.5)


def _ttft_scrape(total_s: float, count: float) -> str:
    """vLLM's TTFT histogram as its /metrics shows it, over two engines."""
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for engine in ("0", "1"):
        labels = f'engine="{engine}",model_name="m"'
        lines += [f'vllm:time_to_first_token_seconds_bucket{{{labels},le="0.1"}} {count / 2}',
                  f"vllm:time_to_first_token_seconds_count{{{labels}}} {count / 2}",
                  f"vllm:time_to_first_token_seconds_sum{{{labels}}} {total_s / 2}",
                  f"vllm:time_to_first_token_seconds_created{{{labels}}} 1.7e9"]
    return "\n".join(lines) + "\n"


def test_server_ttft_is_the_level_delta_of_vllms_histogram() -> None:
    before = metrics.parse_spec_counters(SCRAPE + _ttft_scrape(1.0, 10))
    after = metrics.parse_spec_counters(SCRAPE + _ttft_scrape(1.9, 16))
    assert (after.server_ttft_s_sum, after.server_ttft_count) == (1.9, 16)
    lv = metrics.level_metrics([_rec(0)], concurrency=1, duration_s=1.0, warmup_requests=0,
                               counts=metrics.delta(before, after))
    assert lv.server_mean_ttft_ms == pytest.approx(150.0)  # 0.9 s over 6 requests
    none = metrics.level_metrics([_rec(0)], concurrency=1, duration_s=1.0, warmup_requests=0,
                                 counts=metrics.delta(before, before))
    assert none.server_mean_ttft_ms is None  # no request in the delta: nothing to report


# --- vLLM's names, units and percentiles in what is written -----------------------------------

# The keys `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py, vLLM 0.32) that
# a tuner level also measures; a user comparing the two files finds each under the same name.
VLLM_RESULT_KEYS = {
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput", "max_concurrency",
    "num_prompts", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
    "median_itl_ms", "std_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms",
    "std_e2el_ms", "spec_decode_acceptance_rate", "spec_decode_acceptance_length",
    "spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
}


def _spec_level(**kw):
    counts = SpecDecodeCounts(num_drafts=30, num_draft_tokens=90, num_accepted_tokens=48,
                              accepted_per_pos=(28.0, 15.0, 5.0))
    records = [_rec(i, ttft=0.1 * (i + 1), e2e=1.0 + i, out=10 + i, gaps=(0.01 * (i + 1),))
               for i in range(5)]
    return metrics.level_metrics(records, concurrency=4, duration_s=2.0, warmup_requests=0,
                                 counts=counts, **kw)


def test_vllm_record_has_vllm_bench_serve_keys_and_units() -> None:
    rec = _spec_level().vllm_record()
    assert VLLM_RESULT_KEYS <= set(rec)
    assert (rec["max_concurrency"], rec["num_prompts"]) == (4, 5)
    assert rec["spec_decode_acceptance_rate"] == pytest.approx(100 * 48 / 90)  # percent
    assert "concurrency" not in rec and "spec_decode_num_draft_tokens" not in rec
    # vLLM's std is numpy's (population) std
    ttfts = [100.0 * (i + 1) for i in range(5)]
    assert rec["std_ttft_ms"] == pytest.approx(float(np.std(ttfts)))
    # read back under either name (result.json's levels; summary.json is vLLM's, write-only)
    assert LevelMetrics.model_validate(_spec_level().model_dump(by_alias=True)).concurrency == 4


def test_selected_percentiles_are_keyed_as_vllm_keys_them() -> None:
    lv = _spec_level(percentile_metrics=("tpot", "e2el"), metric_percentiles=(50.0, 99.9))
    e2els = [1000.0 * (1.0 + i) for i in range(5)]
    assert set(lv.percentiles) == {"p50_tpot_ms", "p99.9_tpot_ms", "p50_e2el_ms",
                                   "p99.9_e2el_ms"}
    assert lv.percentiles["p99.9_e2el_ms"] == pytest.approx(float(np.percentile(e2els, 99.9)))
    rec = lv.vllm_record()
    assert rec["p50_tpot_ms"] == pytest.approx(lv.median_tpot_ms)
    assert "percentiles" not in rec and "p99_tpot_ms" not in rec  # not asked for


def test_the_vllm_record_has_only_the_asked_percentiles() -> None:
    # summary.json had p90_* keys under --metric-percentiles 50,99 (a README review).
    rec = _spec_level(metric_percentiles=(50.0, 99.0)).vllm_record()
    assert {k for k in rec if k[0] == "p" and k[1].isdigit()} == {
        f"p{p}_{m}_ms" for p in (50, 99) for m in ("ttft", "tpot", "itl")}
    # A level stored before percentiles were selected keeps the fixed ones it has.
    old = _spec_level().model_dump(exclude={"percentiles"})
    assert "p90_tpot_ms" in LevelMetrics.model_validate(old).vllm_record()


def test_default_percentiles_are_vllms() -> None:
    lv = _spec_level()
    assert set(lv.percentiles) == {"p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms"}
    assert lv.percentiles["p99_tpot_ms"] == pytest.approx(lv.p99_tpot_ms)


def test_percentile_keys_follow_vllm() -> None:
    assert metrics.percentile_key("tpot", 99.0) == "p99_tpot_ms"
    assert metrics.percentile_key("itl", 99.9) == "p99.9_itl_ms"


def test_old_level_keys_and_fraction_rate_are_migrated() -> None:
    old = _spec_level().model_dump(mode="json")
    old["spec_decode_num_draft_tokens"] = old.pop("spec_decode_draft_tokens")
    old["spec_decode_num_accepted_tokens"] = old.pop("spec_decode_accepted_tokens")
    old["spec_decode_acceptance_rate"] = 48 / 90  # old folders stored a fraction
    for key in ("std_ttft_ms", "std_itl_ms", "std_e2el_ms", "percentiles"):
        old.pop(key)
    lv = LevelMetrics.model_validate(old)
    assert lv.spec_decode_acceptance_rate == pytest.approx(100 * 48 / 90)
    assert (lv.spec_decode_draft_tokens, lv.spec_decode_accepted_tokens) == (90, 48)
    current = lv.model_dump(mode="json")
    assert LevelMetrics.migrate(current) is current  # a current dict passes untouched
