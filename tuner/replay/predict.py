"""Replay stage, predictions: every replayable config of a space at every level, no engine.

acceptance (tuner.replay.acceptance, over the baseline's tokens or, where bf16 parted the
outputs, over the stream the config follows: tuner.replay.replayer, tuner.replay.streams) x
step cost (tuner.replay.cost, fitted to the study's launches: tuner.replay.calibration) played
out per level (tuner.replay.schedule) -> per config and level: mean TPOT, output throughput and
TTFT, with the measured figures and the error beside them where the config was measured.
Predicted throughput is the baseline's measured throughput times the ratio of the two played
durations, so what the play leaves out cancels (tuner.replay.yardstick). A launched
model-based drafter is predicted at every K up to its launched one
(tuner.replay.drafter_launches). Where the study measured an aligned baseline, each
speculative row also splits its predicted speedup into path_cost (measured) x
pred_speculation_gain. Where the baseline sampled (temperature > 0), acceptance, throughput and
TPOT carry the half-width of a 90% interval (tuner.replay.sampling).

Recommendations never come from here: a predicted point only decides what to launch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner import intervals
from tuner.records.configs import TrialConfig
from tuner.records.drafter_k import DrafterAxis
from tuner.records.predictions import PredictedFigure, PredictedRow, PredictionMiss
from tuner.records.speedup import Measured, SpeedupSplit
from tuner.records.trials import Role
from tuner.replay import acceptance, cost, drafter_k, ngram_v2, sampling
from tuner.replay.calibration import calibrate
from tuner.replay.drafter_launches import drafter_axes
from tuner.replay.measured import MeasuredTrial, by_config, finite, median_level, pooled
from tuner.replay.replayer import Replayer, alternate_stream, streams_line
from tuner.replay.yardstick import Yardstick, play, yardsticks
from tuner.speculative.schedule_rules import autoregressive_drafter
from tuner.tokens import TokenCapture

# The replay's stated accuracy on a launched config's acceptance length, over the requests it
# predicted (the paired schedule), at temperature 0: n-gram steps vLLM's own proposer over the
# same tokens (within 0.4% at c=1 on the H100 and 0.22% on the CPU; docs/accuracy.md), suffix
# replays arctic-inference's tree in the measured order, its batching order at c > 1 aside.
ACCEPTANCE_ACCURACY_PCT = {"ngram": 5.0, "suffix": 10.0}


@dataclass
class Prediction:
    """The predicted table and how it was made."""

    rows: list[PredictedRow]
    costs: dict[int, cost.StepCost]
    seconds: float
    configs: int
    skipped: list[str] = field(default_factory=list)  # configs that could not be replayed, why
    streams: str = ""  # STREAMS: where a speculative launch's tokens part from the baseline's
    temperature: float = 0.0  # the capture's; above 0 the rows carry sampling.PM_COLUMNS
    ngram_path: str | None = None  # the n-gram proposer replayed (ngram_v2); None: not known
    # model-based drafters' K axes, each from its launch at its largest K (tuner.replay.drafter_k)
    drafters: list[DrafterAxis] = field(default_factory=list)

    def extended(self, more: Prediction) -> Prediction:
        """This table with `more`'s configs added: a prediction of other configs from the same
        capture and measured trials (each row depends on its config alone, so nothing here is
        predicted again)."""
        mine = {(r.key, r.concurrency) for r in self.rows}
        rows = [r for r in more.rows if (r.key, r.concurrency) not in mine]
        return dataclasses.replace(
            self, rows=[*self.rows, *rows], seconds=self.seconds + more.seconds,
            configs=self.configs + more.configs, skipped=[*self.skipped, *more.skipped])

    def leaders(self, concurrency: int, n: int, *,
                metric: PredictedFigure = PredictedFigure.OUTPUT_THROUGHPUT
                ) -> list[PredictedRow]:
        """The n best predicted speculative rows at `concurrency` by `metric`, best first."""
        metric = PredictedFigure(metric)
        rows = [r for r in self.rows if r.concurrency == concurrency and r.method != "none"
                and finite(metric.of(r))]
        sign = -1 if metric.higher_is_better else 1
        return sorted(rows, key=lambda r: sign * metric.of(r))[:n]


def predict(base_capture: TokenCapture, configs: Sequence[TrialConfig],
            measured: Sequence[MeasuredTrial], *, max_model_len: int | None, max_num_seqs: int,
            levels: Sequence[int] | None = None, memo: dict | None = None,
            temperature: float = 0.0) -> Prediction:
    """Predict every replayable config of `configs` at every level (default: the capture's).

    `memo` (a dict the caller keeps) carries replays from one call to the next: a search
    re-predicts after every launch, and the acceptance of a config never changes.
    `temperature`: the capture's (the study's workload); above 0 each row carries the
    half-widths of its sampling error (tuner.replay.sampling), and no alternate stream is
    followed: there every launch parts from the baseline by sampling, not by bf16 rounding,
    and picking a stream by how a config drafts on it would bias its acceptance."""
    t0 = time.monotonic()
    levels = [c for c in (levels or base_capture.levels()) if base_capture.level(c, warmup=False)]
    replay = Replayer(base_capture, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       levels=levels, memo=memo, ngram_path=ngram_v2.engine_path(
                           m.ngram_path for m in measured if m.config.method == "ngram"))
    replay.alternate = alternate_stream(replay, measured) if temperature <= 0 else None
    baseline = pooled([m for m in measured if m.role == Role.BASELINE])
    aligned = pooled([m for m in measured if m.aligned])
    costs = calibrate(replay, measured, levels)
    by_key = by_config(measured)
    level_sd = _level_sds(by_key, levels)
    rows: list[PredictedRow] = []
    skipped: list[str] = []
    todo = [cfg for cfg in configs if acceptance.replayable(cfg)]
    axes = drafter_axes(measured, costs, levels, max_num_seqs=max_num_seqs)
    on_axes = {p.key for a in axes for p in a.points}
    skipped += [_not_replayable(cfg, axes) for cfg in configs
                if cfg.method != "none" and cfg not in todo and cfg.key() not in on_axes]
    calibrated_on = {p.label for c in costs.values() for p in c.points}
    slots = {c: min(c, max_num_seqs) for c in levels}
    yardstick = yardsticks(base_capture, measured, costs, max_num_seqs=max_num_seqs)
    for cfg in [TrialConfig(), *todo]:
        try:
            acc = replay.acceptance(cfg) if cfg.speculative_config else {}
        except ValueError as e:
            skipped.append(f"{cfg.label()}: {e}")
            continue
        for c in levels:
            row = _row(cfg, c, acc.get(c), costs.get(c), baseline.get(c),
                       replay, slots[c], yardstick.get(c))
            row = sampling.with_spread(row, acc.get(c), temperature=temperature)
            row = _measured(by_key.get(cfg.key()), c, row, level_sd=level_sd.get(c))
            row = _decomposed(row, baseline.get(c), aligned.get(c))
            rows.append(dataclasses.replace(
                row, calibration=cfg.label() in calibrated_on,
                alternate_stream_requests=replay.switched.get(cfg.key(), 0),
                ngram_path=(replay.ngram_path or ngram_v2.UNKNOWN)
                if cfg.method == "ngram" else None))
    for ax in axes:
        for p in ax.points:
            row = _measured(by_key.get(p.key), p.concurrency, _axis_row(ax, p),
                            level_sd=level_sd.get(p.concurrency))
            rows.append(_decomposed(row, baseline.get(p.concurrency),
                                    aligned.get(p.concurrency)))
    return Prediction(rows=rows, costs=costs, seconds=time.monotonic() - t0,
                      configs=len(todo) + len(on_axes), skipped=skipped,
                      streams=streams_line(replay), temperature=temperature,
                      ngram_path=replay.ngram_path, drafters=axes)


def _axis_row(ax: DrafterAxis, p: Any) -> PredictedRow:
    """A K of a drafter's axis at a level as a predicted.csv row."""
    spec = {**json.loads(ax.speculative_config), "num_speculative_tokens": p.k}
    cfg = TrialConfig(speculative_config=spec)
    cost_of = next((c for c in ax.costs if c.concurrency == p.concurrency), None)
    return PredictedRow(
        key=p.key, label=cfg.label(), method=ax.method,
        speculative_config=json.dumps(spec, sort_keys=True), concurrency=p.concurrency,
        acceptance_rate=(p.acceptance_length - 1.0) / p.k, acceptance_length=p.acceptance_length,
        drafted_per_step=float(p.k), tokens_per_step=p.acceptance_length,
        per_position=json.dumps([round(x, 4) for x in p.per_position]),
        pred_output_throughput=p.output_throughput, pred_mean_tpot_ms=p.mean_tpot_ms,
        pred_mean_ttft_ms=p.mean_ttft_ms, pred_speedup=p.speedup, calibration=p.fitted,
        path=(drafter_k.PATH_CALIBRATED if cost_of.calibrated else drafter_k.PATH_ONE_LAUNCH)
        if cost_of is not None else None)


def _not_replayable(cfg: TrialConfig, axes: Sequence[DrafterAxis]) -> str:
    if autoregressive_drafter(cfg.method):
        mine = [a.source_k for a in axes
                if a.speculative_config == json.dumps(cfg.speculative_config_without_k(),
                                                      sort_keys=True)]
        if mine:
            return (f"{cfg.label()}: above K={max(mine)}, the largest K launched: the K axis is "
                    "predicted from a launch downward")
        return (f"{cfg.label()}: a model-based drafter is predicted from a launch of it (every "
                "K up to the launched one); none launched yet")
    return f"{cfg.label()}: method {cfg.method} is not replayable"


def _row(cfg: TrialConfig, c: int, acc: acceptance.Acceptance | None,
         step: cost.StepCost | None, base: dict[str, float] | None, replay: Replayer,
         slots: int, yardstick: Yardstick | None) -> PredictedRow:
    """A config's row at level c: its identity, its replayed acceptance and, where the step
    cost prices the level, its predicted figures (the rest is added by `predict`)."""
    spec = cfg.speculative_config
    row = PredictedRow(key=cfg.key(), label=cfg.label(), method=cfg.method,
                       speculative_config=json.dumps(spec, sort_keys=True) if spec else "",
                       concurrency=c, path=step.path if step else None)
    if acc is not None:
        row = dataclasses.replace(
            row, acceptance_rate=acc.acceptance_rate, acceptance_length=acc.acceptance_length,
            drafted_per_step=acc.drafted_per_step, tokens_per_step=acc.tokens_per_step,
            uniform_share=acc.uniform_share,
            per_position=json.dumps([round(x, 4) for x in acc.per_position]),
            steps_per_request=acc.steps / acc.requests if acc.requests else None)
    if base is None:
        return row
    if not spec:  # the plain baseline: measured is what it is
        return dataclasses.replace(
            row, pred_output_throughput=base["output_throughput"],
            pred_mean_tpot_ms=base["mean_tpot_ms"], pred_mean_ttft_ms=base["mean_ttft_ms"],
            pred_speedup=1.0)
    if step is None or not step.calibrated or acc is None or yardstick is None:
        return row
    played = play(step, acc.request_drafts, acc.request_lengths, replay.prompt_lengths(c),
                  k=acc.k, slots=slots)
    thr = yardstick.throughput(played)
    return dataclasses.replace(
        row, pred_mean_tpot_ms=played.mean_tpot_ms, pred_mean_ttft_ms=played.mean_ttft_ms,
        pred_output_throughput=thr, uniform_share=played.uniform_share,
        pred_speedup=thr / base["output_throughput"] if thr else None)


def _decomposed(row: PredictedRow, base: dict[str, float] | None,
                aligned: dict[str, float] | None) -> PredictedRow:
    """The row with pred_speedup = path_cost x pred_speculation_gain where the study measured
    an aligned baseline (tuner.records.speedup.SpeedupSplit): the path's cost is measured
    (aligned over plain throughput at this level), the gain is the predicted throughput over
    the aligned baseline's. Both None otherwise."""
    if base is None or aligned is None or not row.speculative_config:
        return dataclasses.replace(row, path_cost=None, pred_speculation_gain=None)
    split = SpeedupSplit.of(_throughput(row.pred_output_throughput),
                            plain=_throughput(base["output_throughput"]),
                            aligned=_throughput(aligned["output_throughput"]))
    if split is None:
        return dataclasses.replace(row, path_cost=None, pred_speculation_gain=None)
    gain = split.speculation_gain.value
    return dataclasses.replace(row, path_cost=split.path_cost.value,
                               pred_speculation_gain=gain if finite(gain) else None)


def _throughput(value: float | None) -> Measured:
    return Measured(value=value if finite(value) else math.nan)


def _measured(group: list[MeasuredTrial] | None, c: int, row: PredictedRow, *,
              level_sd: float | None = None) -> PredictedRow:
    """The row with the measured figures beside the prediction, its errors, and the measured
    noise an error compares with: the config's own between-launch spread (half its launches'
    range over their median, in percent) and the level's (`level_sd`: _level_sds)."""
    row = dataclasses.replace(row, level_output_throughput_sd_pct=level_sd)
    lv = median_level(group or [], c)
    if lv is None or group is None:
        return row
    runs = [m.levels[c].output_throughput for m in group if c in m.levels]
    runs = [v for v in runs if finite(v) and v > 0]
    return dataclasses.replace(
        row, measured_trials=len(group), meas_output_throughput=lv["output_throughput"],
        meas_mean_tpot_ms=lv["mean_tpot_ms"], meas_mean_ttft_ms=lv["mean_ttft_ms"],
        meas_acceptance_length=lv["spec_decode_acceptance_length"],
        meas_output_throughput_spread_pct=100.0 * (max(runs) - min(runs)) / 2
        / statistics.median(runs) if len(runs) >= 2 else None,
        err_output_throughput_pct=_error_pct(row.pred_output_throughput,
                                             lv["output_throughput"]),
        err_mean_tpot_pct=_error_pct(row.pred_mean_tpot_ms, lv["mean_tpot_ms"]),
        err_acceptance_length_pct=_error_pct(row.acceptance_length,
                                             lv["spec_decode_acceptance_length"]))


def _error_pct(pred: float | None, meas: float | None) -> float | None:
    """100 (pred - meas) / meas; None where either is unknown or meas is 0."""
    if finite(pred) and finite(meas) and meas:
        return 100.0 * (pred - meas) / meas
    return None


def _level_sds(by_key: dict[str, list[MeasuredTrial]], levels: Sequence[int]
               ) -> dict[int, float]:
    """Per level, the between-launch SD of throughput (in percent of it) pooled over every
    config launched there at least twice (tuner.intervals.Pool); levels with none are left
    out."""
    out = {}
    for c in levels:
        pool = intervals.Pool.of([m.levels[c].output_throughput for m in group if c in m.levels]
                                 for group in by_key.values())
        if pool.df:
            out[c] = 100.0 * pool.sd
    return out


def misses(rows: Iterable[PredictedRow], *, temperature: float = 0.0) -> list[PredictionMiss]:
    """The measured rows whose acceptance length the replay missed by more than its stated
    accuracy (ACCEPTANCE_ACCURACY_PCT, for the methods it states one for). At temperature > 0
    the replay carries a sampling interval of its own (tuner.replay.sampling.mismatch)."""
    if temperature > 0:
        return []
    out = []
    for r in rows:
        allowed = ACCEPTANCE_ACCURACY_PCT.get(r.method)
        err = r.err_acceptance_length_pct
        if allowed is None or err is None or not finite(err) or abs(err) <= allowed:
            continue
        out.append(PredictionMiss(
            key=r.key, label=r.label, concurrency=int(r.concurrency),
            predicted=float(r.acceptance_length), measured=float(r.meas_acceptance_length),
            error_pct=float(err), accuracy_pct=allowed))
    return out
