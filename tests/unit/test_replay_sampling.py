"""tuner.replay.sampling inside the replay: predicted rows carry their sampling error where
the baseline sampled, the leaders line and the choice of leaders say which ones the replay
cannot order, and a launch whose measured acceptance the replay does not explain is said
once, noted, and kept for the recommendation of its level."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import optuna
import pytest
from study_fakes import fake_settings

from tuner.outputs import decisions
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.records.predictions import PredictedRow
from tuner.replay import sampling
from tuner.replay.predict import Prediction, predict
from tuner.search import replay_strategy
from tuner.search import study as st
from tuner.tokens import RequestTokens, TokenCapture

NG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
      "prompt_lookup_max": 3}


def _capture() -> TokenCapture:
    """Outputs that copy spans of their prompts, so n-gram drafts get accepted often."""
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(24):
        prompt = rng.integers(0, 50, 200).astype(np.int32)
        parts = [prompt[s:s + 12] for s in rng.integers(0, 180, 6)]
        output = np.concatenate(parts + [rng.integers(50, 90, 10).astype(np.int32)])
        reqs.append(RequestTokens(1, i, False, prompt, output, max_tokens=len(output)))
    return TokenCapture(tuple(reqs))


@pytest.mark.vllm
def test_rows_carry_their_sampling_error_only_where_the_baseline_sampled():
    cap, configs = _capture(), [TrialConfig(speculative_config=NG)]
    greedy = predict(cap, configs, [], max_model_len=None, max_num_seqs=16)
    hot = predict(cap, configs, [], max_model_len=None, max_num_seqs=16, temperature=0.8)
    assert hot.temperature == 0.8 and greedy.temperature == 0.0
    for row in greedy.rows + [r for r in hot.rows if r.method == "none"]:
        assert all(getattr(row, c) is None for c in sampling.PM_COLUMNS)
    (spec,) = [r for r in hot.rows if r.method == "ngram"]
    assert 0 < spec.acceptance_length_pm < spec.acceptance_length - 1
    assert 0 < spec.acceptance_rate_pm < 1
    assert spec.pred_output_throughput_pm is None  # nothing calibrates the step cost


def _row(label: str, thr: float, pm: float | None, method: str = "ngram") -> PredictedRow:
    return PredictedRow(key=label, label=label, method=method, concurrency=4,
                        speculative_config="{}", pred_output_throughput=thr,
                        pred_output_throughput_pm=pm, pred_speedup=thr / 100)


def _search(study=None) -> types.SimpleNamespace:
    said, events, detail = [], [], []
    narrator = decisions.Narrator(None, say=said.append, detail=detail.append)

    def record(event, *, store=True, show=True):
        if store:
            events.append(event)
        narrator(event, store=store, show=show)
    return types.SimpleNamespace(
        view=types.SimpleNamespace(target=4, engine=EngineSpec(model="m", device="cpu")),
        leaders=2, study=study, said=said, events=events, details=detail, record=record,
        _config_of=lambda r: TrialConfig(speculative_config={**NG, "num_speculative_tokens":
                                                             int(r.label[1:])}),
        _vllm_version=lambda _key: "0.32.0")


def test_leaders_the_replay_cannot_order_are_said_and_at_temperature_0_nothing_changes():
    rows = [_row("k3", 120.0, 4.0), _row("k4", 117.0, 4.0), _row("k5", 116.0, 4.0),
            _row("k6", 100.0, 3.0)]
    pred = Prediction(rows=rows, costs={}, seconds=0.0, configs=4, temperature=0.8)
    search = _search()
    picked = replay_strategy.ReplaySearch._pick_leaders(search, pred)
    assert [c.k for c in picked] == [3, 4]
    assert search.said == ["Predicted leaders at c=4: k3 120.0 \u00b14.0 tok/s (1.20x); "
                           "k4 117.0 \u00b14.0 tok/s (1.17x)"]
    (tied,) = search.details
    leaders, tied_event = search.events
    assert [(r.label, r.output_throughput_pm) for r in leaders.leaders] == [("k3", 4.0),
                                                                            ("k4", 4.0)]
    assert (tied_event.tied, tied_event.best, tied_event.launched) == (2, "k3", ("k4",))
    assert tied.startswith("At temperature 0.8, 2 configs' 90% throughput intervals overlap "
                           "the best's (k3)") and "launched among them: k4;" in tied
    greedy = Prediction(rows=[dataclasses.replace(r, pred_output_throughput_pm=None)
                              for r in rows],
                        costs={}, seconds=0.0, configs=4)
    search = _search()
    replay_strategy.ReplaySearch._pick_leaders(search, greedy)
    assert search.said == ["Predicted leaders at c=4: k3 120.0 tok/s (1.20x); k4 117.0 tok/s "
                           "(1.17x)"] and search.details == []


def test_a_launch_the_replay_does_not_explain_is_said_once_and_reaches_the_recommendation():
    from tuner.analysis.level_context import LevelContext

    study = optuna.create_study()
    st.store_settings(study, fake_settings(workload="sharegpt"))
    row = dataclasses.replace(_row("k3", 120.0, 4.0), acceptance_length=1.43,
                              acceptance_length_pm=0.05, meas_acceptance_length=1.0)
    search = _search(study)
    check = replay_strategy.ReplaySearch._check_sampling
    check(search, Prediction(rows=[row], costs={}, seconds=0.0, configs=1, temperature=0.8))
    check(search, Prediction(rows=[dataclasses.replace(row, concurrency=1), row], costs={},
                             seconds=0.0,
                             configs=1, temperature=0.8))
    (line,) = search.said
    assert line.startswith("vLLM 0.32.0 (cpu) accepted 1.00 tokens per draft step (k3, c=4) "
                           "where the replay predicts 1.43 \u00b1 0.05 at temperature 0.8")
    assert [(e.kind, e.concurrency) for e in search.events] == [
        ("sampling_mismatch", 4), ("sampling_mismatch", 1)]
    settings = st.settings_of(study)
    assert set(settings.sampling_mismatch) == {"1", "4"}
    at = LevelContext(concurrency=4, slos={}, settings=settings)
    assert at.sampling_mismatch == line
    # at temperature 0 the same figures are the replay's own error: nothing is said
    search = _search(optuna.create_study())
    check(search, Prediction(rows=[row], costs={}, seconds=0.0, configs=1))
    assert search.said == [] and search.events == []


def test_the_tables_show_each_half_width_and_say_what_it_is(tmp_path):
    from tuner.outputs import console, predictions

    rows = [dataclasses.replace(
        _row(f"k{k}", 100.0 + k, 2.5), acceptance_length=1.5, acceptance_rate=0.2,
        acceptance_length_pm=0.04, acceptance_rate_pm=0.01, pred_mean_tpot_ms=20.0,
        pred_mean_tpot_ms_pm=0.5, measured_trials=0, calibration=False) for k in (3, 4)]
    table = console.predict_table(rows)
    assert "1.50 \u00b10.04" in table and "104.0 \u00b12.5" in table and "20.0 \u00b10.5" in table
    assert table.endswith(console.SAMPLED_NOTE)
    predictions.write_predictions(rows, tmp_path)
    intro, tables = predictions.prediction_tables(predictions.load_predictions(tmp_path))
    assert console.SAMPLED_NOTE in intro and tables[0][2][0][1] == "1.50 \u00b10.04"
    plain = [sampling.with_half_widths(r, None) for r in rows]
    assert all(getattr(r, c) is None for r in plain for c in sampling.PM_COLUMNS)
    assert "\u00b1" not in console.predict_table(plain)
