"""Replay stage, the K axis of a model-based drafter: every K up to the launched one, at every
level, from one launch at the largest K (tuner.records.drafter_k).

Acceptance. An autoregressive drafter at temperature 0 drafts position i from the context
and positions before i alone, so a draft of K tokens is the first K tokens of the draft of
K_max, and it is accepted at position i exactly when the longer one is. vLLM counts drafts
accepted at each position (vllm:spec_decode_num_accepted_tokens_per_pos); over drafts they
are r_1 >= r_2 >= ..., and the acceptance length at K is 1 + sum_{i<=K} r_i. Its standard
error comes from the counts: the accepted count A capped at K has P(A >= i) = r_i, so
E[A^2] = sum (2i - 1) r_i, and the mean over D drafts has variance Var(A) / D. What this
leaves out (the steps of a launch at K start at other positions than K_max's) is measured
(docs/accuracy.md), not assumed away: the stated accuracy is the larger of
ACCEPTANCE_FLOOR_PCT and Z standard errors of the difference.

Cost. Per level, a speculative step costs step(K) = base + fixed + per_token x K (the step is
the decode time per token times 1 + accepted): base is the baseline's, per_token holds the
target's verify of one more token per sequence and the drafter's forward for one more
position. One launch fits per_token with fixed = 0 (not calibrated: the record says so); a
second launch at another K fits both. Throughput at K is the source launch's measured
throughput scaled by its request time over the predicted one (TTFT and the request's decode
time), so what the model leaves out cancels as for the n-gram replay's yardstick.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence

import numpy as np

from tuner.records.configs import TrialConfig
from tuner.records.drafter_k import DrafterAxis, DrafterCost, KLaunch, KLevel, KPoint
from tuner.records.predictions import PredictionMiss

ACCEPTANCE_FLOOR_PCT = 3.0  # issue 49's goal for acceptance length at K < K_max
THROUGHPUT_ACCURACY_PCT = 5.0  # issue 49's goal for throughput out of sample
Z = 3.0  # standard errors a difference of counts may span before it is a miss
# the step-cost path a K axis row is priced on (PredictedRow.path)
PATH_ONE_LAUNCH = ("drafter K axis from one launch: step linear in K through the baseline "
                   "(the drafter's fixed cost per step not calibrated)")
PATH_CALIBRATED = ("drafter K axis: step = baseline + fixed + per-token x K, fitted on launches "
                   "at two K")


def acceptance_at(per_position: Sequence[float], k: int, drafts: float
                  ) -> tuple[float, float]:
    """(acceptance length, its standard error) at K = k from per-position rates measured
    over `drafts` drafts at K >= k. Raises ValueError for k beyond the rates."""
    if k < 1 or k > len(per_position):
        raise ValueError(f"K={k} outside the launched positions 1-{len(per_position)}")
    r = np.asarray(per_position[:k], dtype=float)
    mean = float(r.sum())
    second = float(((2 * np.arange(1, k + 1) - 1) * r).sum())
    var = max(second - mean * mean, 0.0)
    se = math.sqrt(var / drafts) if drafts > 0 else math.inf
    return 1.0 + mean, se


def fit_cost(concurrency: int, base_step_ms: float, steps: Sequence[tuple[int, float]], *,
             verify_ms_per_token: float | None = None) -> DrafterCost:
    """The level's DrafterCost from the baseline's step and (K, measured step ms) of the
    drafter's launches: per_token alone through the anchor where they hold one K, else
    fixed and per_token by least squares."""
    ks = sorted({k for k, _ in steps})
    if not ks:
        raise ValueError("no launch of the drafter to fit its cost on")
    x = np.array([k for k, _ in steps], dtype=float)
    y = np.array([t - base_step_ms for _, t in steps])
    if len(ks) == 1:
        fixed, per = 0.0, float((x @ y) / (x @ x))
    else:
        per, fixed = (float(v) for v in np.polyfit(x, y, 1))
    return DrafterCost(concurrency=concurrency, base_step_ms=base_step_ms, fixed_ms=fixed,
                       per_token_ms=per, calibrated=len(ks) > 1, fitted_on_k=tuple(ks),
                       verify_ms_per_token=verify_ms_per_token)


def axis(config: TrialConfig, launches: Sequence[KLaunch], baseline: Mapping[int, KLevel], *,
         verify_ms_per_token: Mapping[int, float] | None = None,
         calibrate: bool = True) -> DrafterAxis:
    """The K axis of the drafter of `config` (any K) from its `launches` (one per K launched;
    the largest K is the source of the rates; the cost is fitted on it and, with `calibrate`,
    on the smallest other K; the rest are out of sample) against the `baseline` per level.
    Levels the source or the baseline did not measure are left out."""
    if not launches:
        raise ValueError(f"{config.label()}: no launch to predict the K axis from")
    by_k = {lc.k: lc for lc in launches}
    source = by_k[max(by_k)]
    fitted_k = {source.k, *([min(by_k)] if len(by_k) > 1 and calibrate else [])}
    points, costs = [], []
    for src in source.levels:
        c = src.concurrency
        base = baseline.get(c)
        if base is None or len(src.per_position) < source.k:
            continue
        steps = [(k, lv.decode_ms_per_token * lv.acceptance_length) for k in sorted(fitted_k)
                 if (lv := by_k[k].level(c)) is not None and _finite(lv.acceptance_length)
                 and _finite(lv.decode_ms_per_token)]
        cost = fit_cost(c, base.decode_ms_per_token, steps,
                        verify_ms_per_token=(verify_ms_per_token or {}).get(c)) if steps else None
        if cost is not None:
            costs.append(cost)
        for k in range(1, source.k + 1):
            points.append(_point(config.with_k(k), k, src, base, cost, by_k.get(k),
                                 source=k == source.k, fitted=k in fitted_k and cost is not None))
    spec = config.speculative_config_without_k()
    return DrafterAxis(method=config.method, label=_label(config),
                       speculative_config=json.dumps(spec, sort_keys=True),
                       source_k=source.k, source_trial=source.number, costs=tuple(costs),
                       points=tuple(points))


def prediction_misses(ax: DrafterAxis) -> list[PredictionMiss]:
    """The launches at some K whose measured acceptance length lies beyond the stated accuracy
    of the axis' prediction, as the study keeps every replay miss
    (StudySettings.prediction_misses, which the recommendation reads)."""
    spec = json.loads(ax.speculative_config)
    return [PredictionMiss(
        key=p.key, concurrency=p.concurrency,
        label=TrialConfig(speculative_config={**spec, "num_speculative_tokens": p.k}).label(),
        predicted=p.acceptance_length, measured=float(p.meas_acceptance_length),
        error_pct=float(p.err_acceptance_length_pct),
        accuracy_pct=round(p.acceptance_accuracy_pct, 1))
        for p in ax.points if p.acceptance_miss]


def _point(cfg: TrialConfig, k: int, src: KLevel, base: KLevel, cost: DrafterCost | None,
           launched: KLaunch | None, *, source: bool, fitted: bool) -> KPoint:
    c = src.concurrency
    length, se = acceptance_at(src.per_position, k, src.drafts)
    meas = launched.level(c) if launched is not None else None
    meas_se = None
    if meas is not None and len(meas.per_position) >= k:
        meas_se = acceptance_at(meas.per_position, k, meas.drafts)[1]
    spread = math.hypot(se, meas_se if meas_se is not None else se)
    accuracy = max(ACCEPTANCE_FLOOR_PCT, 100.0 * Z * spread / length)
    point = KPoint(concurrency=c, k=k, key=cfg.key(), per_position=tuple(src.per_position[:k]),
                   acceptance_length=length, acceptance_length_se=se,
                   acceptance_accuracy_pct=accuracy,
                   throughput_accuracy_pct=THROUGHPUT_ACCURACY_PCT, source=source,
                   fitted=fitted)
    figures: dict = {}
    if cost is not None and length > 0:
        step = cost.step_ms(k)
        dpt = step / length
        n1 = max(src.tokens_per_request - 1.0, 0.0)
        ref = src.mean_ttft_ms + n1 * src.decode_ms_per_token
        thr = src.output_throughput * ref / (src.mean_ttft_ms + n1 * dpt)
        figures = dict(step_ms=step, decode_ms_per_token=dpt, output_throughput=thr,
                       mean_tpot_ms=dpt * src.mean_tpot_ms / src.decode_ms_per_token,
                       mean_ttft_ms=src.mean_ttft_ms,
                       speedup=thr / base.output_throughput if base.output_throughput else None)
    if meas is not None and launched is not None:
        figures.update(
            measured_trials=launched.trials, meas_acceptance_length=meas.acceptance_length,
            meas_acceptance_length_se=meas_se, meas_output_throughput=meas.output_throughput,
            meas_mean_tpot_ms=meas.mean_tpot_ms,
            err_acceptance_length_pct=_error_pct(length, meas.acceptance_length),
            err_output_throughput_pct=_error_pct(figures.get("output_throughput"),
                                                 meas.output_throughput))
    return dataclasses.replace(point, **figures)


def _label(config: TrialConfig) -> str:
    return config.with_k(1).label().replace(" k=1", "")


def _error_pct(pred: float | None, meas: float | None) -> float | None:
    if _finite(pred) and _finite(meas) and meas:
        return 100.0 * (pred - meas) / meas
    return None


def _finite(x: float | None) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
