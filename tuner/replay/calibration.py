"""Replay stage, the step cost fitted to a study's launches: per level, the cost of an engine
step (tuner.replay.cost), and the engine's prefill cost, from what the measured trials'
levels took, played out on the replayed drafts (tuner.replay.schedule).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.records.trials import Role
from tuner.replay import acceptance, cost, schedule
from tuner.replay.measured import MeasuredTrial, by_config, finite, median_level
from tuner.replay.replayer import Replayer, level_output_lengths, level_prompt_lengths


def calibrate(replay: Replayer, measured: Sequence[MeasuredTrial],
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
        observed[c] = [o for group in by_config(anchor).values()
                       if (o := _observed(replay, group, c, anchor=True)) is not None]
        observed[c] += [o for group in by_config(chosen).values()
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


def _profile(replay: Replayer, trials: Sequence[MeasuredTrial], c: int
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


def _observed(replay: Replayer, group: list[MeasuredTrial], c: int, *,
              anchor: bool) -> _Observed | None:
    lv = median_level(group, c)
    if lv is None or not finite(lv["decode_ms_per_token"]):
        return None
    own = next((m.capture for m in group if m.capture is not None), None)
    cap = own or replay.capture
    lengths, prompts = level_output_lengths(cap, c), level_prompt_lengths(cap, c)
    ttft = lv["mean_ttft_ms"] if finite(lv["mean_ttft_ms"]) else None
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
