"""Predictions on the n-gram path the engine runs: V1's numba proposer or V2's Triton scan
(tuner.replay.ngram_v2), taken from what the study's n-gram launches recorded
(MeasuredTrial.ngram_path, from tuner.measure.enginepath); unknown where none said, and then
the rows say so."""

from __future__ import annotations

import math

import pytest
from test_replay_predict import _capture  # outputs that copy spans of their prompts

from tuner.outputs.predictions import ngram_path_note
from tuner.records.configs import TrialConfig
from tuner.records.results import LevelMetrics
from tuner.replay import acceptance, ngram_v2, schedule
from tuner.replay.measured import MeasuredTrial
from tuner.replay.predict import predict
from tuner.tokens import TokenCapture

pytestmark = pytest.mark.vllm  # steps vLLM's proposers


def replay_spec(capture, spec, **kwargs):
    """acceptance.replay of the --speculative-config `spec`."""
    return acceptance.replay(capture, TrialConfig(speculative_config=spec), **kwargs)


A_MS, B_MS = {1: 8.0, 2: 9.0}, {1: 0.5, 2: 0.4}
NG = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1,
      "prompt_lookup_max": 4}
SMALL = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
         "prompt_lookup_max": 3}


def _level(c: int, played: schedule.Schedule, acc_len: float | None) -> LevelMetrics:
    nan, completed = math.nan, len(played.ttft_ms)
    ttft = played.mean_ttft_ms
    e2e = ttft + played.decode_ms_per_token * (played.output_tokens - completed) / completed
    return LevelMetrics(
        concurrency=c, num_requests=completed, completed=completed, failed=0,
        warmup_requests=c, duration=1.0, total_input_tokens=0,
        total_output_tokens=played.output_tokens, request_throughput=0.0,
        output_throughput=played.output_throughput,
        total_token_throughput=played.output_throughput, mean_ttft_ms=ttft,
        median_ttft_ms=ttft, p90_ttft_ms=nan, p99_ttft_ms=nan, mean_tpot_ms=played.mean_tpot_ms,
        median_tpot_ms=played.mean_tpot_ms, p90_tpot_ms=nan, p99_tpot_ms=nan, std_tpot_ms=0.0,
        mean_itl_ms=nan, median_itl_ms=nan, p90_itl_ms=nan, p99_itl_ms=nan, mean_e2el_ms=e2e,
        median_e2el_ms=e2e, p99_e2el_ms=nan, spec_decode_acceptance_length=acc_len)


def _trial(number: int, cap: TokenCapture, spec: dict | None, role: str, *,
           engine: str, recorded: str | None) -> MeasuredTrial:
    """What a synthetic engine whose steps cost A + B x tokens scored measures, drafting as
    the `engine` path drafts; the launch records `recorded` as its n-gram path."""
    levels = {}
    for c in (1, 2):
        reqs = sorted(cap.level(c, warmup=False), key=lambda r: r.index)
        lengths = [len(r.output) for r in reqs]
        if spec is None:
            drafts, k, acc_len = schedule.baseline_drafts(lengths), 0, None
        else:
            acc = replay_spec(cap, spec, levels=[c], ngram_path=engine)[c]
            drafts, k, acc_len = acc.request_drafts, acc.k, acc.acceptance_length
        played = schedule.simulate(drafts, lengths, concurrency=c, k=k,
                                   step_ms=lambda n, u, c=c: A_MS[c] + B_MS[c] * n,
                                   prompts=[len(r.prompt) for r in reqs])
        levels[c] = _level(c, played, acc_len)
    return MeasuredTrial(number, TrialConfig(speculative_config=spec), role, levels, cap,
                         ngram_path=recorded if spec else None)


def _predict(engine: str, recorded: str | None):
    cap = _capture()
    measured = [_trial(0, cap, None, "baseline", engine=engine, recorded=None),
                _trial(1, cap, NG, "calibration", engine=engine, recorded=recorded),
                _trial(2, cap, SMALL, "confirm", engine=engine, recorded=recorded)]
    configs = [TrialConfig(speculative_config=s) for s in (NG, SMALL)]
    return predict(cap, configs, measured, max_model_len=4096, max_num_seqs=16)


def _small(pred) -> list[dict]:
    return [r for r in pred.rows if r.label == TrialConfig(speculative_config=SMALL).label()]


def test_a_v2_engine_is_predicted_on_v2_drafts_k_every_step_and_out_of_sample_exactly():
    pred = _predict("V2", "V2")
    assert pred.ngram_path == "V2"
    for c in (1, 2):
        assert pred.costs[c].b == pytest.approx(B_MS[c], rel=1e-3)
    for r in _small(pred):
        assert r.ngram_path == "V2"
        assert r.drafted_per_step == pytest.approx(3.0)  # the cost side: K every step
        assert r.uniform_share == pytest.approx(1.0)
        assert r.err_acceptance_length_pct == pytest.approx(0.0, abs=1e-9)
        assert r.err_output_throughput_pct == pytest.approx(0.0, abs=0.5)
    assert next(r for r in pred.rows if r.method == "none").ngram_path is None


def test_a_v2_engine_replayed_as_v1_misses_what_it_drafts():
    """The path matters: V1's drafts of the same tokens are fewer, and their acceptance
    length differs from what the V2 engine measured."""
    v1 = _small(_predict("V2", "V1"))
    assert all(r.drafted_per_step < 3.0 for r in v1)
    assert any(abs(r.err_acceptance_length_pct) > 1.0 for r in v1)


def test_no_recorded_path_replays_v1_and_every_ngram_row_says_unknown():
    unknown, known = _predict("V1", None), _predict("V1", "V1")
    assert unknown.ngram_path is None and known.ngram_path == "V1"
    for a, b in zip(unknown.rows, known.rows, strict=True):
        assert a.ngram_path == (ngram_v2.UNKNOWN if a.method == "ngram" else None)
        assert b.ngram_path == ("V1" if b.method == "ngram" else None)
        # ... and the figures are V1's, as every replay before V2 was modeled.
        assert (a.acceptance_length, a.drafted_per_step, a.pred_output_throughput) == \
            (b.acceptance_length, b.drafted_per_step, b.pred_output_throughput)
    note = ngram_path_note(unknown.rows)
    assert note is not None and "may not be the engine's" in note and "V1" in note
    assert "V2" in ngram_path_note(_predict("V2", "V2").rows)
    assert ngram_path_note([r for r in known.rows if r.method == "none"]) is None


def test_launches_that_disagree_on_the_path_leave_it_unknown():
    assert ngram_v2.engine_path(["V1", "V2"]) is None
    assert ngram_v2.engine_path(["V1-gpu"]) is None  # not modeled
    assert ngram_v2.engine_path([None, "V2", "V2"]) == "V2"
    assert ngram_v2.engine_path([]) is None


def test_the_report_says_the_path_through_predicted_csv(tmp_path):
    from tuner.outputs.predictions import load_predictions, prediction_tables, write_predictions

    for engine, recorded, words in (("V2", "V2", "Triton scan"),
                                    ("V1", None, "may not be the engine's")):
        write_predictions(_predict(engine, recorded).rows, tmp_path / engine)
        intro, _ = prediction_tables(load_predictions(tmp_path / engine))
        assert any(words in line for line in intro), intro


def test_tuner_predicts_table_says_the_path_too():
    from tuner.outputs.console import predict_table

    assert "may not be the engine's" in predict_table(_predict("V1", None).rows)
    assert "Triton scan" in predict_table(_predict("V2", "V2").rows)
