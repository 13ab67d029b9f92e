"""Replay stage, the K axis of a model-based drafter: every K up to the launched one, at every
level, from one launch at the largest K (tuner.records.drafter_k).

Acceptance. An autoregressive drafter at temperature 0 drafts position i from the context
and positions before i alone, and the target's tokens are the same at every K, so at every
position t of the output the drafter agrees with the target for a length L(t) that does not
depend on K, and L(t+1) = L(t) - 1 while L(t) > 0. The output falls into segments: one starts
where the drafter has just been corrected, with a fresh agreement length l, and holds l + 1
tokens (the agreed ones and the correction). A launch at K steps through a segment in
ceil((l + 1) / (K + 1)) steps, its later steps starting inside the segment where the drafter
still agrees; so the acceptance length at K is tokens over steps, E[l + 1] / E[ceil((l + 1) /
(K + 1))] over segments, not 1 + the first K per-position rates of the launch at K_max (which
would start every step afresh and fall 1-4% short: benchmarks/data/cpu-drafter-k). vLLM
counts drafts accepted at each position (vllm:spec_decode_num_accepted_tokens_per_pos); over
the K_max launch's drafts they are r_1 >= r_2 >= ... >= r_K. Beyond K_max the agreement is
taken to go on at the last position's conditional rate rho = r_K / r_{K-1}; a share rho r_K of
that launch's steps then continue a segment, and the rest start one, which gives the fresh
agreement's survival u_i = (r_i - rho r_K rho^i) / (1 - rho r_K) (segment_survival). At
K = K_max it returns 1 + the sum of the rates, as measured. The standard error comes from the
counts: the accepted count of the K_max launch's drafts is multinomial over 0..K_max, and the
length a smooth function of its shares (delta method). What this leaves out (segments cut by
a request's end, a tail that is not geometric) is measured (docs/accuracy.md): the stated
accuracy is the larger of ACCEPTANCE_FLOOR_PCT and Z standard errors of the difference.

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
RHO_MAX = 0.99  # the tail's conditional rate at most (a drafter that never stops agreeing)
DRAFTER_MAX_AGREEMENT = 10_000  # the longest agreement the error's sum runs over


def segment_survival(per_position: Sequence[float]) -> tuple[np.ndarray, float]:
    """(u_0..u_n, rho): the survival P(l >= i) of a segment's fresh agreement length l, u_0 = 1,
    from the per-position rates of a launch at K = n, and the tail's rate beyond n."""
    r = np.clip(np.asarray(per_position, dtype=float), 0.0, 1.0)
    before = r[-2] if len(r) >= 2 else 1.0
    rho = min(float(r[-1] / before), RHO_MAX) if before > 0 else 0.0
    cont = rho * float(r[-1])  # the launch's steps that go on inside a segment
    u = (r - cont * rho ** np.arange(1, len(r) + 1)) / (1.0 - cont)
    u = np.minimum.accumulate(np.clip(u, 0.0, 1.0))
    return np.concatenate([[1.0], u]), rho


def rates_at(per_position: Sequence[float], k: int) -> tuple[float, ...]:
    """The per-position rates a launch at K = k would count (accepted at position i over its
    drafts), from the rates of a launch at K = len(per_position) >= k. Raises ValueError for
    k beyond the rates."""
    n = len(per_position)
    if k < 1 or k > n:
        raise ValueError(f"K={k} outside the launched positions 1-{n}")
    if k == n:
        return tuple(float(x) for x in per_position)
    u, rho = segment_survival(per_position)

    def survival(i: int) -> float:
        return float(u[i]) if i <= n else float(u[n]) * rho ** (i - n)

    # A segment of fresh agreement l takes steps at offsets 0, k+1, 2(k+1), ...; the step at
    # offset o accepts at position i when l - o >= i.
    steps = 0.0
    tail = np.zeros(k)
    m = 0
    while True:
        start = m * (k + 1)
        first = survival(start)
        if first < 1e-12:
            break
        steps += first
        tail += [survival(start + i) for i in range(1, k + 1)]
        m += 1
    accepted = tail / steps
    return tuple(float(x) for x in accepted)


def acceptance_at(per_position: Sequence[float], k: int, drafts: float
                  ) -> tuple[float, float]:
    """(acceptance length, its standard error) at K = k from per-position rates measured
    over `drafts` drafts at K = len(per_position) >= k. Raises ValueError for k beyond the
    rates. The error counts segments, not drafts, as the independent draws: a draft that
    goes on inside the last one's agreement is not a new draw (delta method over the
    segments' agreement lengths, as segment_survival gives them)."""
    n = len(per_position)
    length = 1.0 + sum(rates_at(per_position, k))
    if drafts <= 0:
        return length, math.inf
    rates = np.asarray(per_position, dtype=float)
    eps = 1e-6
    grad = np.array([(1.0 + sum(rates_at(rates + eps * np.eye(n)[i], k)) - length) / eps
                     for i in range(n)])
    # Per segment of fresh agreement l, the K = n launch drafts d(l) times and accepts
    # position i in c_i(l) of them; the rates are sum c_i / sum d over its segments.
    u, rho = segment_survival(per_position)
    last = n
    while last < DRAFTER_MAX_AGREEMENT and float(u[n]) * rho ** (last - n) > 1e-12:
        last += 1
    survival = np.concatenate([u, float(u[n]) * rho ** np.arange(1, last - n + 2)])
    share = survival[:-1] - survival[1:]  # P(l) for l = 0..last
    lengths = np.arange(len(share))
    d = lengths // (n + 1) + 1
    c = np.stack([np.where(lengths >= i, (lengths - i) // (n + 1) + 1, 0)
                  for i in range(1, n + 1)])
    z = grad @ (c - rates[:, None] * d)
    var = float(share @ z ** 2) / (drafts * float(share @ d))
    return length, math.sqrt(max(var, 0.0))


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
    point = KPoint(concurrency=c, k=k, key=cfg.key(), per_position=rates_at(src.per_position, k),
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
