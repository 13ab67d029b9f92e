"""Replay stage, predictions: every replayable config of a space at every level, no engine.

acceptance (tuner.replay.acceptance, over the baseline's tokens or, where bf16 parted the
outputs, over the stream the config follows: tuner.replay.streams) x step cost
(tuner.replay.cost) played out per level (tuner.replay.schedule) -> per config and level:
mean TPOT, output throughput and TTFT, with the measured figures and the error beside them
where the config was measured. Predicted throughput is the baseline's measured throughput times
the ratio of the two played durations, so what the play leaves out cancels (a traffic's
replay is priced on the same `play` and `Yardstick`: tuner.replay.traffic.price). Where the study
measured an aligned baseline, each speculative row also splits its predicted speedup into
path_cost (measured) x pred_speculation_gain. Where the baseline sampled (temperature > 0),
acceptance, throughput and TPOT carry the half-width of a 90% interval (tuner.replay.sampling).

Recommendations never come from here: a predicted point only decides what to launch.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner import intervals
from tuner.records.configs import TrialConfig
from tuner.records.drafter_k import DrafterAxis, KLaunch, KLevel
from tuner.records.predictions import PredictedFigure, PredictedRow, PredictionMiss
from tuner.records.results import LevelMetrics
from tuner.records.speedup import Measured, SpeedupSplit
from tuner.records.trials import Role
from tuner.replay import acceptance, cost, drafter_k, ngram_v2, sampling, schedule, streams
from tuner.speculative.schedule_rules import autoregressive_drafter
from tuner.tokens import TokenCapture

# The replay's stated accuracy on a launched config's acceptance length, over the requests it
# predicted (the paired schedule), at temperature 0: n-gram steps vLLM's own proposer over the
# same tokens (within 0.4% at c=1 on the H100 and 0.22% on the CPU; docs/accuracy.md), suffix
# replays arctic-inference's tree in the measured order, its batching order at c > 1 aside.
ACCEPTANCE_ACCURACY_PCT = {"ngram": 5.0, "suffix": 10.0}


@dataclass(frozen=True)
class MeasuredTrial:
    """A finished trial as the predictor needs it (the search stage builds these)."""

    number: int
    config: TrialConfig
    role: Role  # a Role value given as its string is read as the Role
    levels: dict[int, LevelMetrics]
    capture: TokenCapture | None = None
    cudagraph_mode: str | None = None  # as the engine path read it from the trial's log
    ngram_path: str | None = None  # an n-gram launch's proposer, as the engine path read it

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", Role(self.role))

    @property
    def aligned(self) -> bool:
        return self.role == Role.ALIGNED_BASELINE

    @property
    def speculative(self) -> bool:
        return bool(self.config.speculative_config)


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
                and _finite(metric.of(r))]
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
    replay = _Replayer(base_capture, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       levels=levels, memo=memo, ngram_path=ngram_v2.engine_path(
                           m.ngram_path for m in measured if m.config.method == "ngram"))
    replay.alternate = _alternate(replay, measured) if temperature <= 0 else None
    baseline = _pooled([m for m in measured if m.role == Role.BASELINE])
    aligned = _pooled([m for m in measured if m.aligned])
    costs = calibrate(replay, measured, levels)
    by_key = _by_config(measured)
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
                      streams=_streams_line(replay), temperature=temperature,
                      ngram_path=replay.ngram_path, drafters=axes)


def drafter_axes(measured: Sequence[MeasuredTrial], costs: dict[int, cost.StepCost],
                 levels: Sequence[int], *, max_num_seqs: int, calibrate: bool = True
                 ) -> list[DrafterAxis]:
    """The K axis of every launched model-based drafter (tuner.replay.drafter_k): its
    launches grouped by config without K (a K schedule is another config), each K's levels
    the medians over its launches, against the baseline (the aligned one's step where the
    study measured one, the plain one's throughput); the verify part of the drafter's cost
    per token from the study's step cost where it is calibrated. `calibrate` False: the cost
    on each drafter's largest K alone (what one launch predicts), the others out of sample."""
    groups: dict[str, list[MeasuredTrial]] = {}
    for m in measured:
        spec = m.config.speculative_config or {}
        if (m.speculative and autoregressive_drafter(m.config.method)
                and m.config.k and "num_speculative_tokens_per_batch_size" not in spec):
            groups.setdefault(m.config.with_k(1).key(), []).append(m)
    plain = _pooled([m for m in measured if m.role == "baseline"])
    anchor = _pooled([m for m in measured if m.aligned]) or plain
    baseline = {c: dataclasses.replace(lv, output_throughput=plain[c]["output_throughput"])
                for c in levels if c in anchor and c in plain
                and (lv := _k_level(anchor[c], c)) is not None}
    verify = {c: s.b * min(c, max_num_seqs) for c, s in costs.items() if s.calibrated}
    out = []
    for group in groups.values():
        launches = []
        for key, same in _by_config(group).items():
            lvs = tuple(lv for c in levels if (lv := _k_level(_level_of(same, c), c)) is not None)
            if lvs:
                launches.append(KLaunch(number=min(m.number for m in same),
                                        k=int(same[0].config.k), key=key, levels=lvs,
                                        trials=len(same)))
        if launches:
            source = max(launches, key=lambda lc: lc.k)
            cfg = next(m.config for m in group if m.config.key() == source.key)
            out.append(drafter_k.axis(cfg, launches, baseline, verify_ms_per_token=verify,
                                      calibrate=calibrate))
    return out


def _level_of(group: Sequence[MeasuredTrial], c: int) -> dict[str, Any] | None:
    """_median_level with vLLM's draft counts and per-position rates (medians per position
    over the group's launches) beside it."""
    lv = _median_level(group, c)
    levels = [m.levels[c] for m in group if c in m.levels]
    if lv is None:
        return None
    positions = [x.spec_decode_per_position_acceptance_rates for x in levels]
    width = min((len(p) for p in positions), default=0)
    lv["per_position"] = tuple(statistics.median(p[i] for p in positions) for i in range(width))
    lv["drafts"] = statistics.median(x.spec_decode_num_drafts for x in levels)
    lv["tokens_per_request"] = statistics.median(
        x.total_output_tokens / x.completed for x in levels if x.completed) \
        if any(x.completed for x in levels) else None
    return lv


def _k_level(lv: dict[str, Any] | None, c: int) -> KLevel | None:
    """A level's medians (`_level_of`, or a baseline's `_median_level`) as the K axis reads
    them; None where a figure it needs is missing."""
    if lv is None:
        return None
    needed = ("decode_ms_per_token", "output_throughput", "mean_ttft_ms", "mean_tpot_ms")
    if not all(_finite(lv.get(n)) for n in needed):
        return None
    length = lv.get("spec_decode_acceptance_length")
    return KLevel(concurrency=c, drafts=float(lv.get("drafts") or 0.0),
                  per_position=tuple(lv.get("per_position") or ()),
                  acceptance_length=length if _finite(length) else 1.0,
                  decode_ms_per_token=lv["decode_ms_per_token"],
                  output_throughput=lv["output_throughput"], mean_ttft_ms=lv["mean_ttft_ms"],
                  mean_tpot_ms=lv["mean_tpot_ms"],
                  tokens_per_request=float(lv.get("tokens_per_request") or 0.0))


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


def calibrate(replay: _Replayer, measured: Sequence[MeasuredTrial],
              levels: Sequence[int]) -> dict[int, cost.StepCost]:
    """The step cost per level, and the engine's prefill cost, from the study's measured trials.

    Calibration launches (role "calibration") are used when the study has any; otherwise every
    measured replayable speculative config is (then each one's error is in-sample). What a
    trial's steps scored, and how long prefills of other requests stalled them, comes from
    playing its level out (tuner.replay.schedule), which depends on the costs being fitted:
    fit and play are iterated (FIT_ROUNDS; 3, 6 and 10 rounds gave the same predictions on the
    stored H200 launches of benchmarks/data/h200/stepcost-64p)."""
    spec = [m for m in measured if m.speculative and acceptance.replayable(m.config)]
    chosen = [m for m in spec if m.role == "calibration"] or spec
    aligned = [m for m in measured if m.aligned]
    anchor = aligned or [m for m in measured if m.role == Role.BASELINE]
    path = cost.PATH_ALIGNED if aligned else cost.PATH_PLAIN
    mixed_term = any(m.cudagraph_mode in cost.SPLIT_CUDAGRAPH_MODES for m in spec)
    observed: dict[int, list[_Observed]] = {}
    for c in levels:
        observed[c] = [o for group in _by_config(anchor).values()
                       if (o := _observed(replay, group, c, anchor=True)) is not None]
        observed[c] += [o for group in _by_config(chosen).values()
                        if (o := _observed(replay, group, c, anchor=False)) is not None]
    slots = {c: min(c, replay.max_num_seqs) for c in levels}
    fitted: dict[int, cost.StepCost] = {}
    prefill = cost.Prefill()
    for _ in range(FIT_ROUNDS):
        for c in levels:
            step = fitted[c].step_ms if c in fitted else _unit_step
            points = [p for o in observed[c] if (p := o.point(step, slots[c], prefill))]
            if (line := cost.fit(c, points, path=path, mixed_term=mixed_term)) is not None:
                fitted[c] = line
        prefill = _fit_prefill(observed, fitted, slots)
    profiles = {c: _profile(replay, chosen, c) for c in fitted
                if slots[c] == 1 and not mixed_term}
    return {c: dataclasses.replace(line, prefill=prefill, profile=profiles.get(c, ()))
            for c, line in fitted.items()}


def _profile(replay: _Replayer, trials: Sequence[MeasuredTrial], c: int
             ) -> tuple[tuple[int, float, int], ...]:
    """The step shape at level c (tuner.replay.cost): every chunk gap of the trials' measured
    requests beside the tokens that step scored, from the replay of each launch's own tokens;
    a request whose chunks are not one per replayed step (coalesced, or not recorded) is left
    out."""
    launches: list[list[tuple[int, float]]] = []
    for m in trials:
        if m.capture is None:
            continue
        try:
            acc = replay.acceptance(m.config, capture=m.capture).get(c)
        except ValueError:
            continue
        if acc is None:
            continue
        order = acc.request_order
        samples: list[tuple[int, float]] = []
        launches.append(samples)
        for r in m.capture.level(c, warmup=False):
            i = order.get(r.index)
            if i is None or len(r.chunk_ms) != len(drafts := acc.request_drafts[i]):
                continue
            samples += zip((1 + drafts).tolist(), r.chunk_ms.tolist(), strict=True)
    return cost.profile(launches)


FIT_ROUNDS = 3


def _unit_step(scored: float, mixed: float) -> float:
    return 1.0


@dataclass(frozen=True)
class _Observed:
    """One measured config at one level, as the cost fit reads it."""

    label: str
    anchor: bool
    k: int
    drafts: list[np.ndarray]
    lengths: list[int]
    prompts: list[int]
    decode_ms: float  # the level's decode time per token (tuner.replay.schedule)
    ttft_ms: float | None

    def play(self, step: schedule.StepFn, slots: int, prefill: cost.Prefill
             ) -> schedule.Schedule:
        return schedule.simulate(self.drafts, self.lengths, concurrency=slots, k=self.k,
                                 step_ms=step, prompts=self.prompts,
                                 prefill_ms_per_token=prefill.ms_per_token,
                                 overhead_ms=prefill.overhead_ms)

    def point(self, step: schedule.StepFn, slots: int, prefill: cost.Prefill
              ) -> cost.Point | None:
        played = self.play(step, slots, prefill)
        if not played.coef_a:
            return None
        return cost.Point(label=self.label, scored=played.scored_per_step,
                          step_ms=(self.decode_ms - played.stall_ms) / played.coef_a,
                          ttft_ms=self.ttft_ms if self.ttft_ms is not None else math.nan,
                          anchor=self.anchor, mixed=played.mixed_per_step)


def _observed(replay: _Replayer, group: list[MeasuredTrial], c: int, *,
              anchor: bool) -> _Observed | None:
    lv = _median_level(group, c)
    if lv is None or not _finite(lv["decode_ms_per_token"]):
        return None
    own = next((m.capture for m in group if m.capture is not None), None)
    cap = own or replay.capture
    lengths, prompts = _lengths(cap, c), _prompts(cap, c)
    ttft = lv["mean_ttft_ms"] if _finite(lv["mean_ttft_ms"]) else None
    label = group[0].config.label()
    if anchor:
        return _Observed(label, True, 0, schedule.baseline_drafts(lengths), lengths, prompts,
                         lv["decode_ms_per_token"], ttft)
    try:
        acc = replay.acceptance(group[0].config, capture=own).get(c)
    except ValueError:
        return None
    if acc is None or not acc.steps:
        return None
    return _Observed(label, False, acc.k, acc.request_drafts, lengths, prompts,
                     lv["decode_ms_per_token"], ttft)


def _fit_prefill(observed: dict[int, list[_Observed]], fitted: dict[int, cost.StepCost],
                 slots: dict[int, int]) -> cost.Prefill:
    """The engine's prefill cost per prompt token (q) and the frontend's latency (o) from every
    observed mean TTFT: played out with o = 0, a level's TTFT is t0 + q g (near enough linear in
    q: g is how many prompt tokens a request's first token waits for, its own and the ones
    prefilled before or with it), so meas = o + t0 + q g is a least-squares line in (o, q).
    At c=1 every request waits for its own prompt alone, so q and o cannot be told apart there:
    q is fitted only where levels differ in g (else q = 0 and o takes the whole TTFT, which is
    exact at c=1). Two passes: the second takes g at the first pass's q."""
    obs = [(o, c) for c, group in observed.items() if c in fitted for o in group
           if o.ttft_ms is not None]
    if not obs:
        return cost.Prefill()
    probe = max(o.ttft_ms / max(1.0, statistics.fmean(o.prompts or [1])) for o, _ in obs)
    q = 0.0
    for _ in range(2):
        at = q if q > 0 else probe
        rows = []
        for o, c in obs:
            t_lo = o.play(fitted[c].step_ms, slots[c], cost.Prefill()).mean_ttft_ms
            t_hi = o.play(fitted[c].step_ms, slots[c], cost.Prefill(at, 0.0)).mean_ttft_ms
            if t_lo is None or t_hi is None:
                continue
            rows.append((o.ttft_ms - t_lo, (t_hi - t_lo) / at))
        if not rows:
            return cost.Prefill()
        q, o_ms = _nonnegative_line(rows)
    return cost.Prefill(ms_per_token=q, overhead_ms=o_ms)


def _nonnegative_line(rows: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(q, o) >= 0 minimizing sum (y - o - q g)^2 over rows (y, g)."""
    ys = np.array([y for y, _ in rows])
    gs = np.array([g for _, g in rows])
    if gs.max() - gs.min() > 1e-6 * max(1.0, abs(gs).max()):
        q, o = np.polyfit(gs, ys, 1)
        if q >= 0 and o >= 0:
            return float(q), float(o)
        if q >= 0:  # o < 0: through the origin
            return max(0.0, float((gs @ ys) / (gs @ gs))), 0.0
    return 0.0, max(0.0, float(ys.mean()))


class _Replayer:
    """Replays configs over one capture, once per (config, capture); with an alternate
    stream (tuner.replay.streams), over the stream each request of the config follows."""

    def __init__(self, capture: TokenCapture, *, max_model_len: int | None, max_num_seqs: int,
                 levels: Sequence[int], memo: dict | None = None,
                 ngram_path: str | None = None) -> None:
        self.capture, self.levels = capture, list(levels)
        self.ngram_path = ngram_path  # the n-gram proposer the engine runs; None: not known
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self._memo: dict[tuple, dict[int, acceptance.Acceptance]] = {} if memo is None else memo
        self.alternate: streams.Alternate | None = None
        self.switched: dict[str, int] = {}  # config key -> requests on the alternate's stream

    @functools.cached_property
    def partings(self) -> dict[tuple[int, int], int]:
        return self.alternate.partings(self.capture) if self.alternate else {}

    def acceptance(self, cfg: TrialConfig, *, capture: TokenCapture | None = None
                   ) -> dict[int, acceptance.Acceptance]:
        """The config's acceptance per level: over `capture` (a launch's own tokens) when
        given, else over the baseline's tokens, each request on the stream it follows."""
        own = self._replay(cfg, capture or self.capture)
        if capture is not None or self.alternate is None:
            return own
        followed, switched = streams.follow(self.capture, own, self.alternate, self.partings)
        self.switched[cfg.key()] = switched
        return own if not switched else self._replay(cfg, followed)

    def _replay(self, cfg: TrialConfig, cap: TokenCapture) -> dict[int, acceptance.Acceptance]:
        memo_key = (cfg.key(), cap.digest, tuple(self.levels), self.max_model_len,
                    self.max_num_seqs, self.ngram_path or ngram_v2.V1)  # None replays V1
        if memo_key not in self._memo:
            self._memo[memo_key] = acceptance.replay(
                cap, cfg, max_model_len=self.max_model_len,
                max_num_seqs=self.max_num_seqs, levels=self.levels, ngram_path=self.ngram_path)
        return self._memo[memo_key]

    def prompt_lengths(self, c: int) -> list[int]:
        return _prompts(self.capture, c)


def _alternate(replay: _Replayer, measured: Sequence[MeasuredTrial]) -> streams.Alternate | None:
    """STREAMS: the measured speculative launch whose tokens stand for what drafting engines
    emit where the baseline's part from them: the first calibration launch (the config that
    drafts the most), else the first measured replayable speculative launch with tokens."""
    spec = [m for m in measured if m.speculative and m.capture is not None
            and acceptance.replayable(m.config)]
    if not spec:
        return None
    pick = min(spec, key=lambda m: (m.role != "calibration", m.number))
    try:
        replayed = replay.acceptance(pick.config, capture=pick.capture)
    except ValueError:
        return None
    return streams.Alternate(capture=pick.capture, replayed=replayed, label=pick.config.label())


def _streams_line(replay: _Replayer) -> str:
    """One line on STREAMS for the console: how many measured requests of the alternate
    launch part from the baseline's, and how many configs follow it there."""
    if replay.alternate is None or not replay.partings:
        return ""
    requests = sum(1 for c in replay.levels for r in replay.capture.level(c, warmup=False))
    following = sum(1 for n in replay.switched.values() if n)
    return (f"token streams: {len(replay.partings)} of {requests} measured requests part from "
            f"the baseline's under {replay.alternate.label}; {following} of "
            f"{len(replay.switched)} configs follow that stream there (their drafting passes "
            "match it: tuner.replay.streams)")


def _lengths(capture: TokenCapture, c: int) -> list[int]:
    return [len(r.output) for r in sorted(capture.level(c, warmup=False), key=lambda r: r.index)]


def _prompts(capture: TokenCapture, c: int) -> list[int]:
    return [len(r.prompt) for r in sorted(capture.level(c, warmup=False), key=lambda r: r.index)]


def _row(cfg: TrialConfig, c: int, acc: acceptance.Acceptance | None,
         step: cost.StepCost | None, base: dict[str, float] | None, replay: _Replayer,
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


def play(step: cost.StepCost, drafts: list[np.ndarray], lengths: list[int],
         prompts: list[int], *, k: int, slots: int) -> schedule.Schedule:
    """Requests of these output and prompt lengths, with these drafts per verify step (k = 0:
    no speculation), played out on the fitted step cost with `slots` in flight."""
    return schedule.simulate(drafts, lengths, concurrency=slots, k=k,
                             step_ms=step.speculative_step_ms if k else step.step_ms,
                             prompts=prompts, prefill_ms_per_token=step.prefill.ms_per_token,
                             overhead_ms=step.prefill.overhead_ms)


@dataclass(frozen=True)
class Yardstick:
    """A measured baseline and its level played out on the fitted costs: every predicted
    duration is set against it, so what the play leaves out (the load generator's own time,
    the frontend) cancels. `plain_throughput`: the plain baseline's measured, where the
    yardstick is an aligned baseline (else its own)."""

    played: schedule.Schedule
    measured_throughput: float
    plain_throughput: float | None = None

    def throughput(self, played: schedule.Schedule) -> float | None:
        """The measured throughput of `played`, a play of the yardstick's own requests."""
        if played.duration_ms <= 0 or not _finite(self.measured_throughput):
            return None
        return self.measured_throughput * self.played.duration_ms / played.duration_ms

    @property
    def factor(self) -> float | None:
        """Measured over played throughput: what turns a played throughput of other requests
        (a traffic's, tuner.replay.traffic.price) into a measured one."""
        played = self.played.output_throughput
        return self.measured_throughput / played if played and _finite(
            self.measured_throughput) else None

    @property
    def path_ratio(self) -> float | None:
        """The plain baseline's measured throughput over the yardstick's (1 where the yardstick
        is the plain baseline)."""
        if not _finite(self.plain_throughput) or not _finite(self.measured_throughput) \
                or not self.measured_throughput:
            return None
        return self.plain_throughput / self.measured_throughput


def yardsticks(capture: TokenCapture, measured: Sequence[MeasuredTrial],
               costs: dict[int, cost.StepCost], *, max_num_seqs: int) -> dict[int, Yardstick]:
    """Per level of `costs`: the baseline the step cost is anchored on (the aligned one where
    the study measured it), `capture`'s requests at that level played out on the fitted cost,
    beside its measured throughput. Levels nothing measured or no cost prices are left out."""
    plain = _pooled([m for m in measured if m.role == Role.BASELINE])
    anchor = _pooled([m for m in measured if m.aligned]) or plain
    out = {}
    for c, step in costs.items():
        if c in anchor and (played := _played_baseline(step, capture, c,
                                                       min(c, max_num_seqs))) is not None:
            out[c] = Yardstick(played, anchor[c]["output_throughput"],
                               plain[c]["output_throughput"] if c in plain else None)
    return out


def _played_baseline(step: cost.StepCost | None, capture: TokenCapture, c: int,
                     slots: int) -> schedule.Schedule | None:
    """No speculation, the capture's requests, played out on the fitted costs."""
    lengths = _lengths(capture, c)
    if step is None or not step.calibrated or not lengths:
        return None
    return play(step, schedule.baseline_drafts(lengths), lengths, _prompts(capture, c), k=0,
                slots=slots)


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
                               pred_speculation_gain=gain if _finite(gain) else None)


def _throughput(value: float | None) -> Measured:
    return Measured(value=value if _finite(value) else math.nan)


def _measured(group: list[MeasuredTrial] | None, c: int, row: PredictedRow, *,
              level_sd: float | None = None) -> PredictedRow:
    """The row with the measured figures beside the prediction, its errors, and the measured
    noise an error compares with: the config's own between-launch spread (half its launches'
    range over their median, in percent) and the level's (`level_sd`: _level_sds)."""
    row = dataclasses.replace(row, level_output_throughput_sd_pct=level_sd)
    lv = _median_level(group or [], c)
    if lv is None or group is None:
        return row
    runs = [m.levels[c].output_throughput for m in group if c in m.levels]
    runs = [v for v in runs if _finite(v) and v > 0]
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
    if _finite(pred) and _finite(meas) and meas:
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
    values = [v for lv in levels if _finite(v := _decode_ms_per_token(lv))]
    out["decode_ms_per_token"] = statistics.median(values) if values else None
    return out


def _decode_ms_per_token(lv: LevelMetrics) -> float | None:
    """sum(e2e - TTFT) / sum(N - 1) over the level's completed requests: its decode time per
    token (mean TPOT where the level holds no latencies to derive it from). The cost fit reads
    this, not mean TPOT: at c=4 on sharegpt (16 requests, five of one or two tokens) one
    request of two tokens whose only gap held another's 1.2 s prefill made the baseline's
    mean TPOT 145 ms in one pass and 57 ms in the next."""
    decoded = lv.total_output_tokens - lv.completed
    if decoded <= 0 or not _finite(lv.mean_e2el_ms) or not _finite(lv.mean_ttft_ms):
        return lv.mean_tpot_ms
    return (lv.mean_e2el_ms - lv.mean_ttft_ms) * lv.completed / decoded


def _pooled(group: Sequence[MeasuredTrial]) -> dict[int, dict[str, float]]:
    levels = sorted({c for m in group for c in m.levels})
    return {c: lv for c in levels if (lv := _median_level(group, c)) is not None}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


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
        if allowed is None or err is None or not _finite(err) or abs(err) <= allowed:
            continue
        out.append(PredictionMiss(
            key=r.key, label=r.label, concurrency=int(r.concurrency),
            predicted=float(r.acceptance_length), measured=float(r.meas_acceptance_length),
            error_pct=float(err), accuracy_pct=allowed))
    return out
