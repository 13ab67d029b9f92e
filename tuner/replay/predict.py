"""Replay stage, predictions: every replayable config of a space at every level, no engine.

acceptance (tuner.replay.acceptance, over the plain baseline's tokens) x step cost
(tuner.replay.cost, fitted on the study's measured trials) -> per config and level: mean TPOT,
output throughput and TTFT, with the measured figures beside them where the config was
measured, and the prediction's error there. Where the study measured an aligned baseline (no
speculation on the speculative engine path), each speculative row also splits its predicted
speedup over the plain baseline into path_cost (measured) x pred_speculation_gain.

The model, per level c and config X, over the baseline's measured requests r (N_r output
tokens; S_r decode steps under X, from the replay; d_X draft tokens per request-step):

    step_X   = a_c + b_c * c * (1 + d_X) + m_c * u_X         (tuner.replay.cost; u_X the share
                                                              of X's steps not uniform, m_c
                                                              fitted only on split CUDA graphs)
    TPOT_X   = step_X * mean_r(S_r / (N_r - 1))
    e2e_r,X  = TTFT_X + S_r * step_X
    thr_X    = thr_baseline * sum_r e2e_r,baseline / sum_r e2e_r,X   (closed loop: same requests,
                                                                    same concurrency)

Recommendations never come from here: a predicted point only decides what to launch.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.records import LevelMetrics, TrialConfig
from tuner.replay import acceptance, cost
from tuner.tokens import TokenCapture

BASELINE_ROLES = ("baseline", "aligned_baseline")


@dataclass(frozen=True)
class MeasuredTrial:
    """A finished trial as the predictor needs it (the search stage builds these)."""

    number: int
    config: TrialConfig
    role: str
    levels: dict[int, LevelMetrics]
    capture: TokenCapture | None = None
    cudagraph_mode: str | None = None  # as the engine path read it from the trial's log

    @property
    def aligned(self) -> bool:
        return self.role == "aligned_baseline"

    @property
    def speculative(self) -> bool:
        return bool(self.config.speculative_config)


@dataclass
class Prediction:
    """The predicted table and how it was made."""

    rows: list[dict[str, Any]]
    costs: dict[int, cost.StepCost]
    seconds: float
    configs: int
    skipped: list[str] = field(default_factory=list)  # configs that could not be replayed, why

    def leaders(self, concurrency: int, n: int, *, metric: str = "pred_output_throughput"
                ) -> list[dict[str, Any]]:
        """The n best predicted speculative rows at `concurrency`, best first."""
        rows = [r for r in self.rows if r["concurrency"] == concurrency and r["method"] != "none"
                and _finite(r.get(metric))]
        sign = -1 if metric.endswith("throughput") else 1
        return sorted(rows, key=lambda r: sign * r[metric])[:n]


def predict(base_capture: TokenCapture, configs: Sequence[TrialConfig],
            measured: Sequence[MeasuredTrial], *, max_model_len: int, max_num_seqs: int,
            levels: Sequence[int] | None = None, memo: dict | None = None) -> Prediction:
    """Predict every replayable config of `configs` at every level (default: the capture's).

    `memo` (a dict the caller keeps) carries replays from one call to the next: a search
    re-predicts after every launch, and the acceptance of a config never changes."""
    t0 = time.monotonic()
    levels = [c for c in (levels or base_capture.levels()) if base_capture.level(c, warmup=False)]
    replay = _Replayer(base_capture, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       levels=levels, memo=memo)
    baseline = _pooled([m for m in measured if m.role == "baseline"])
    aligned = _pooled([m for m in measured if m.aligned])
    costs = calibrate(replay, measured, levels)
    by_key = _by_config(measured)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    todo = [cfg for cfg in configs if acceptance.replayable(cfg.speculative_config)]
    skipped += [f"{cfg.label()}: method {cfg.method} is not replayable"
                for cfg in configs if cfg.method != "none" and cfg not in todo]
    calibrated_on = {p.label for c in costs.values() for p in c.points}
    for cfg in [TrialConfig(), *todo]:
        try:
            acc = replay.acceptance(cfg) if cfg.speculative_config else {}
        except ValueError as e:
            skipped.append(f"{cfg.label()}: {e}")
            continue
        for c in levels:
            row = _row(cfg, c, acc.get(c), costs.get(c), baseline.get(c),
                       replay.output_lengths(c))
            row.update(_measured(by_key.get(cfg.key()), c, row))
            row.update(_decomposed(row, baseline.get(c), aligned.get(c)))
            row["calibration"] = cfg.label() in calibrated_on
            rows.append(row)
    return Prediction(rows=rows, costs=costs, seconds=time.monotonic() - t0,
                      configs=len(todo), skipped=skipped)


def calibrate(replay: _Replayer, measured: Sequence[MeasuredTrial],
              levels: Sequence[int]) -> dict[int, cost.StepCost]:
    """The step-cost line per level from the study's measured trials.

    Calibration launches (role "calibration") are used when the study has any; otherwise every
    measured replayable speculative config is (then each one's error is in-sample)."""
    spec = [m for m in measured if m.speculative and acceptance.replayable(
        m.config.speculative_config)]
    chosen = [m for m in spec if m.role == "calibration"] or spec
    aligned = [m for m in measured if m.aligned]
    anchor = aligned or [m for m in measured if m.role == "baseline"]
    path = cost.PATH_ALIGNED if aligned else cost.PATH_PLAIN
    mixed_term = any(m.cudagraph_mode in cost.SPLIT_CUDAGRAPH_MODES for m in spec)
    out = {}
    for c in levels:
        points = []
        for group in _by_config(anchor).values():
            lv = _median_level(group, c)
            if lv is not None:
                points.append(cost.Point(label=group[0].config.label(), scored=float(c),
                                         step_ms=lv["mean_tpot_ms"], ttft_ms=lv["mean_ttft_ms"],
                                         anchor=True))
        for group in _by_config(chosen).values():
            lv = _median_level(group, c)
            if lv is None:
                continue
            own = next((m.capture for m in group if m.capture is not None), None)
            try:
                acc = replay.acceptance(group[0].config, capture=own).get(c)
            except ValueError:
                continue
            if acc is None or not acc.steps:
                continue
            lengths = replay.output_lengths(c) if own is None else _lengths(own, c)
            ratio = _step_ratio(acc.request_steps, lengths)
            if ratio:
                points.append(cost.Point(
                    label=group[0].config.label(), scored=c * (1 + acc.drafted_per_step),
                    step_ms=lv["mean_tpot_ms"] / ratio, ttft_ms=lv["mean_ttft_ms"],
                    mixed=1.0 - acc.uniform_share))
        fitted = cost.fit(c, points, path=path, mixed_term=mixed_term)
        if fitted is not None:
            out[c] = fitted
    return out


class _Replayer:
    """Replays configs over one capture, once per (config, capture)."""

    def __init__(self, capture: TokenCapture, *, max_model_len: int, max_num_seqs: int,
                 levels: Sequence[int], memo: dict | None = None) -> None:
        self.capture, self.levels = capture, list(levels)
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self._memo: dict[tuple, dict[int, acceptance.Acceptance]] = {} if memo is None else memo

    def acceptance(self, cfg: TrialConfig, *, capture: TokenCapture | None = None
                   ) -> dict[int, acceptance.Acceptance]:
        cap = capture or self.capture
        memo_key = (cfg.key(), cap.digest, tuple(self.levels), self.max_model_len,
                    self.max_num_seqs)
        if memo_key not in self._memo:
            self._memo[memo_key] = acceptance.replay(
                cap, cfg.speculative_config, max_model_len=self.max_model_len,
                max_num_seqs=self.max_num_seqs, levels=self.levels)
        return self._memo[memo_key]

    def output_lengths(self, c: int) -> list[int]:
        return _lengths(self.capture, c)


def _lengths(capture: TokenCapture, c: int) -> list[int]:
    return [len(r.output) for r in sorted(capture.level(c, warmup=False), key=lambda r: r.index)]


def _step_ratio(steps: Sequence[int], lengths: Sequence[int]) -> float | None:
    """mean over requests of decode steps per TPOT token, S_r / (N_r - 1) (TPOT's definition)."""
    ratios = [s / (n - 1) for s, n in zip(steps, lengths, strict=False) if n > 1]
    return statistics.fmean(ratios) if ratios else None


def _row(cfg: TrialConfig, c: int, acc: acceptance.Acceptance | None,
         step: cost.StepCost | None, base: dict[str, float] | None,
         lengths: list[int]) -> dict[str, Any]:
    spec = cfg.speculative_config
    row: dict[str, Any] = {
        "key": cfg.key(), "label": cfg.label(), "method": cfg.method,
        "speculative_config": json.dumps(spec, sort_keys=True) if spec else "",
        "concurrency": c, "acceptance_rate": None, "acceptance_length": None,
        "drafted_per_step": 0.0, "tokens_per_step": 1.0, "uniform_share": 1.0,
        "per_position": "",
        "steps_per_request": None,
        "pred_output_throughput": None, "pred_mean_tpot_ms": None, "pred_mean_ttft_ms": None,
        "pred_speedup": None, "path": step.path if step else None}
    if acc is not None:
        row.update(acceptance_rate=acc.acceptance_rate, acceptance_length=acc.acceptance_length,
                   drafted_per_step=acc.drafted_per_step, tokens_per_step=acc.tokens_per_step,
                   uniform_share=acc.uniform_share,
                   per_position=json.dumps([round(x, 4) for x in acc.per_position]),
                   steps_per_request=acc.steps / acc.requests if acc.requests else None)
    if base is None:
        return row
    if not spec:  # the plain baseline: measured is what it is
        row.update(pred_output_throughput=base["output_throughput"],
                   pred_mean_tpot_ms=base["mean_tpot_ms"], pred_mean_ttft_ms=base["mean_ttft_ms"],
                   pred_speedup=1.0)
        return row
    if step is None or not step.calibrated or acc is None:
        return row
    steps = acc.request_steps
    ratio = _step_ratio(steps, lengths)
    if ratio is None:
        return row
    t = step.step_ms(c * (1 + acc.drafted_per_step), 1.0 - acc.uniform_share)
    ttft = step.ttft_ms(c * (1 + acc.drafted_per_step))
    base_sum = sum(base["mean_ttft_ms"] + (n - 1) * base["mean_tpot_ms"] for n in lengths)
    spec_sum = sum(ttft + s * t for s in steps)
    thr = base["output_throughput"] * base_sum / spec_sum if spec_sum > 0 else None
    row.update(pred_mean_tpot_ms=t * ratio, pred_mean_ttft_ms=ttft, pred_output_throughput=thr,
               pred_speedup=thr / base["output_throughput"] if thr else None)
    return row


def _decomposed(row: dict[str, Any], base: dict[str, float] | None,
                aligned: dict[str, float] | None) -> dict[str, Any]:
    """pred_speedup = path_cost x pred_speculation_gain where the study measured an aligned
    baseline: the path's cost is measured (aligned over plain throughput at this level), the
    gain is the predicted throughput over the aligned baseline's. Both None otherwise."""
    out: dict[str, Any] = {"path_cost": None, "pred_speculation_gain": None}
    if base is None or aligned is None or not row["speculative_config"]:
        return out
    thr_base, thr_aligned = base["output_throughput"], aligned["output_throughput"]
    if not (_finite(thr_base) and _finite(thr_aligned) and thr_base > 0 and thr_aligned > 0):
        return out
    out["path_cost"] = thr_aligned / thr_base
    if _finite(row["pred_output_throughput"]):
        out["pred_speculation_gain"] = row["pred_output_throughput"] / thr_aligned
    return out


def _measured(group: list[MeasuredTrial] | None, c: int, row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"measured_trials": 0, "meas_output_throughput": None,
                           "meas_mean_tpot_ms": None, "meas_mean_ttft_ms": None,
                           "meas_acceptance_length": None, "err_output_throughput_pct": None,
                           "err_mean_tpot_pct": None, "err_acceptance_length_pct": None}
    lv = _median_level(group or [], c)
    if lv is None:
        return out
    out.update(measured_trials=len(group), meas_output_throughput=lv["output_throughput"],
               meas_mean_tpot_ms=lv["mean_tpot_ms"], meas_mean_ttft_ms=lv["mean_ttft_ms"],
               meas_acceptance_length=lv["spec_decode_acceptance_length"])
    for name, pred, meas in (
            ("err_output_throughput_pct", row["pred_output_throughput"], lv["output_throughput"]),
            ("err_mean_tpot_pct", row["pred_mean_tpot_ms"], lv["mean_tpot_ms"]),
            ("err_acceptance_length_pct", row["acceptance_length"],
             lv["spec_decode_acceptance_length"])):
        if _finite(pred) and _finite(meas) and meas:
            out[name] = 100.0 * (pred - meas) / meas
    return out


def _by_config(measured: Iterable[MeasuredTrial]) -> dict[str, list[MeasuredTrial]]:
    out: dict[str, list[MeasuredTrial]] = {}
    for m in measured:
        out.setdefault(m.config.key(), []).append(m)
    return out


_FIELDS = ("output_throughput", "mean_tpot_ms", "mean_ttft_ms", "spec_decode_acceptance_length")


def _median_level(group: Sequence[MeasuredTrial], c: int) -> dict[str, float] | None:
    """Each figure's median over the group's repeats at level c (None where none measured c)."""
    levels = [m.levels[c] for m in group if c in m.levels]
    if not levels:
        return None
    out = {}
    for name in _FIELDS:
        values = [v for lv in levels if _finite(v := getattr(lv, name))]
        out[name] = statistics.median(values) if values else None
    return out


def _pooled(group: Sequence[MeasuredTrial]) -> dict[int, dict[str, float]]:
    levels = sorted({c for m in group for c in m.levels})
    return {c: lv for c in levels if (lv := _median_level(group, c)) is not None}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
