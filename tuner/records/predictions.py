"""What the replay predicts: one config at one level, with the measured figures beside it
(PredictedRow, a row of predicted.csv: tuner.replay.predict), or over a user's own request
logs (TrafficRow, a row of traffic.csv: tuner.replay.traffic), and the predicted figure a
ranking is by; and a launched config whose measured acceptance the replay missed beyond its
stated accuracy (PredictionMiss). Field names are the files' column names; `csv_row` is the one
place a row becomes the dict those files are written from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from tuner.records.configs import Frozen


@dataclass(frozen=True, kw_only=True)
class _Row:
    """The leading columns of either file: the config at a level, and its replayed acceptance
    (a subclass's own fields follow these, in its file's column order)."""

    # identity
    key: str
    label: str
    method: str
    speculative_config: str = ""  # JSON with sorted keys; "" for the baseline
    concurrency: int
    # acceptance, replayed
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    drafted_per_step: float = 0.0
    tokens_per_step: float = 1.0

    def csv_row(self) -> dict[str, Any]:
        """The row as predicted.csv, traffic.csv and `tuner predict --json` write it: every
        field, by its name, in the record's order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, kw_only=True)
class PredictedRow(_Row):
    """A config at a level as the replay predicts it: acceptance over the baseline's tokens,
    throughput, TPOT and TTFT on the fitted step cost, and, where the study measured the
    config, the measured medians beside them and the prediction's errors (percent, predicted
    above measured positive). None where a figure is not predicted or not measured."""

    uniform_share: float = 1.0  # the played steps' share in which every request drafted K
    per_position: str = ""  # JSON list: acceptance per draft position
    steps_per_request: float | None = None
    # predicted on the step cost
    pred_output_throughput: float | None = None
    pred_mean_tpot_ms: float | None = None
    pred_mean_ttft_ms: float | None = None
    pred_speedup: float | None = None
    path: str | None = None  # the step-cost model's engine path, as StepCost names it
    # half-widths of 90% intervals where the baseline sampled (tuner.replay.sampling)
    acceptance_rate_pm: float | None = None
    acceptance_length_pm: float | None = None
    pred_output_throughput_pm: float | None = None
    pred_mean_tpot_ms_pm: float | None = None
    # measured beside it: medians over the config's launches, and the prediction's errors
    measured_trials: int = 0
    meas_output_throughput: float | None = None
    meas_mean_tpot_ms: float | None = None
    meas_mean_ttft_ms: float | None = None
    meas_acceptance_length: float | None = None
    err_output_throughput_pct: float | None = None
    err_mean_tpot_pct: float | None = None
    err_acceptance_length_pct: float | None = None
    # the noise an error compares with: half the config's launches' range over their median,
    # and the level's between-launch SD pooled over the configs launched twice (percent)
    meas_output_throughput_spread_pct: float | None = None
    level_output_throughput_sd_pct: float | None = None
    # pred_speedup = path_cost (measured) x pred_speculation_gain, with an aligned baseline
    path_cost: float | None = None
    pred_speculation_gain: float | None = None
    calibration: bool = False  # a calibration launch's row: its error is in-sample
    alternate_stream_requests: int = 0  # requests replayed on the alternate stream (STREAMS)
    ngram_path: str | None = None  # an n-gram row's replayed proposer; None for other methods


@dataclass(frozen=True, kw_only=True)
class TrafficRow(_Row):
    """A config at a level replayed over a user's own request logs: acceptance, the vLLM
    spec-decode counters it would report, and throughput, TPOT and speedup where a study
    prices the level; the half-widths of 90% intervals unless every request says
    temperature 0."""

    per_position: str = ""  # JSON list: acceptance per draft position
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: float = 0.0  # past-end acceptance included, as vLLM counts it
    pred_output_throughput: float | None = None
    pred_mean_tpot_ms: float | None = None
    pred_mean_ttft_ms: float | None = None
    pred_speedup: float | None = None
    acceptance_rate_pm: float | None = None
    acceptance_length_pm: float | None = None
    pred_output_throughput_pm: float | None = None
    pred_mean_tpot_ms_pm: float | None = None


# Either row: what the console ranks and tuner.replay.sampling gives half-widths.
Row = TypeVar("Row", PredictedRow, TrafficRow)


class PredictedFigure(str, Enum):
    """A predicted figure rows are ranked by, named as its column."""

    OUTPUT_THROUGHPUT = "pred_output_throughput"
    MEAN_TPOT = "pred_mean_tpot_ms"

    @property
    def higher_is_better(self) -> bool:
        return self is PredictedFigure.OUTPUT_THROUGHPUT

    def of(self, row: PredictedRow | TrafficRow) -> float | None:
        if self is PredictedFigure.OUTPUT_THROUGHPUT:
            return row.pred_output_throughput
        return row.pred_mean_tpot_ms

    def half_width(self, row: PredictedRow | TrafficRow) -> float | None:
        """The figure's sampling half-width (its `_pm` column)."""
        if self is PredictedFigure.OUTPUT_THROUGHPUT:
            return row.pred_output_throughput_pm
        return row.pred_mean_tpot_ms_pm


class PredictionMiss(Frozen):
    """A launched config whose measured acceptance length at a level lies further from the
    replay's prediction, over the same requests, than the replay's stated accuracy
    (tuner.replay.predict.ACCEPTANCE_ACCURACY_PCT): the prediction, or the measurement, is
    not what it claims to be."""

    key: str
    label: str
    concurrency: int
    predicted: float
    measured: float
    error_pct: float  # 100 (predicted - measured) / measured
    accuracy_pct: float

    def text(self) -> str:
        """The one line the study prints and the report and the recommendation repeat."""
        return (f"Prediction missed at c={self.concurrency}: {self.label} measured acceptance "
                f"length {self.measured:.2f} where the replay predicted {self.predicted:.2f} "
                f"over the same requests ({self.error_pct:+.1f}%, beyond its stated "
                f"±{self.accuracy_pct:g}%); check that launch's engine log and tokens before "
                f"relying on it.")
