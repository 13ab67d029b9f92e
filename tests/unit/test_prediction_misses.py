"""Predictions checked on the requests they predict (tuner/replay/predict.py misses): a
launched config whose measured acceptance the replay missed beyond its stated accuracy is a
PredictionMiss, said in one line; within the accuracy, or at temperature > 0 (where the
sampling interval decides), it is not.
"""

from __future__ import annotations

import pandas as pd
import pytest
from study_fakes import fake_settings

from tuner.analysis.level_context import LevelContext
from tuner.records.predictions import PredictedRow, PredictionMiss
from tuner.replay.predict import ACCEPTANCE_ACCURACY_PCT, misses


def _row(method: str, predicted: float, measured: float | None, c: int = 1) -> PredictedRow:
    err = None if measured is None else 100.0 * (predicted - measured) / measured
    return PredictedRow(key=f"{method}-{predicted}", label=f"{method} k=5", method=method,
                        concurrency=c, acceptance_length=predicted,
                        meas_acceptance_length=measured, err_acceptance_length_pct=err)


def test_a_miss_beyond_the_stated_accuracy_is_found_per_method():
    assert ACCEPTANCE_ACCURACY_PCT == {"ngram": 5.0, "suffix": 10.0}
    rows = [_row("ngram", 4.21, 2.45),   # the c=1 miss: +71.8%
            _row("ngram", 3.00, 2.90),   # +3.4%: within 5%
            _row("suffix", 4.71, 4.40),  # +7.0%: within 10% for suffix
            _row("suffix", 4.71, 12.95, c=4),  # -63.6%
            _row("ngram", 3.0, None),    # not launched
            _row("none", 1.0, 1.0)]
    found = misses(rows)
    assert [(m.label, m.concurrency) for m in found] == [("ngram k=5", 1), ("suffix k=5", 4)]
    first = found[0]
    assert first.error_pct == pytest.approx(71.84, abs=0.01) and first.accuracy_pct == 5.0
    assert first.text() == (
        "Prediction missed at c=1: ngram k=5 measured acceptance length 2.45 where the replay "
        "predicted 4.21 over the same requests (+71.8%, beyond its stated ±5%); check that "
        "launch's engine log and tokens before relying on it.")
    assert misses(rows, temperature=0.8) == []  # the sampling interval's call there


def test_a_recommendation_resting_on_a_missed_config_names_the_miss():
    miss = PredictionMiss(key="k", label="ngram k=5", concurrency=1, predicted=4.21,
                          measured=2.45, error_pct=71.8, accuracy_pct=5.0)
    other = miss.model_copy(update={"concurrency": 4})
    settings = fake_settings().model_copy(update={"prediction_misses": (miss, other)})
    at = LevelContext(1, {}, settings)
    assert at.misses(pd.Series({"config_key": "k"})) == (miss,)
    assert at.misses(pd.Series({"config_key": "x"})) == ()
