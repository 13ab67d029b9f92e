"""Analysis stage, the policy's open-loop check: vLLM keys K on the scheduled requests,
prefills included, so arrivals swing the batch across a band edge. Per edge, the open-loop
level that crosses it (open_loop_plan), what it launches (open_loop_lineup), the schedule
against each static K there (open_loop_check), and the schedule revised where it dips beyond
the spread: the two bands merged unless the merge gives up a closed-loop gain (merge_cost,
merged_at_dips, with_open_loop).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from tuner.analysis.ladder_stats import measured, throughput_series
from tuner.analysis.schedule import policy_config
from tuner.records.configs import TrialConfig
from tuner.records.policy import (
    Band,
    BandEdge,
    EdgeCheck,
    Figure,
    LadderRun,
    LevelSpeedup,
    MergeCost,
    OpenLoop,
    OpenLoopLevel,
    PolicyDocument,
)
from tuner.records.trials import Role


def band_edges(schedule: Sequence[Band]) -> list[BandEdge]:
    """Where K changes: per pair of neighbouring bands, the last batch size of the lower one
    (`edge`; K flips between edge and edge + 1) and the two Ks."""
    return [BandEdge(edge=int(lo[1]), k_below=int(lo[2]), k_above=int(hi[2]))
            for lo, hi in zip(schedule, schedule[1:], strict=False) if lo[2] != hi[2]]


def open_loop_plan(schedule: Sequence[Band], closed: dict[int, Sequence[float]]
                   ) -> list[OpenLoopLevel]:
    """Per band edge, the open-loop level that swings the batch across it: Poisson arrivals
    at the closed-loop request throughput at the edge (`closed`: {ladder level: requests/s
    per run}, medians log2-interpolated at edge + 0.5, clamped to the ladder), capped at the
    first ladder level above the edge (so the batch can cross it; vLLM counts prefills in
    the batch the schedule is keyed on). Edges without a ladder level above are left out; two
    edges never share a cap (every band holds a measured level)."""
    levels = sorted(c for c, xs in closed.items() if xs)
    if not levels:
        return []
    med = {c: statistics.median(closed[c]) for c in levels}
    out = []
    for edge in band_edges(schedule):
        cap = next((c for c in levels if c > edge.edge), None)
        if cap is None:
            continue
        at = min(max(edge.edge + 0.5, levels[0]), levels[-1])
        lo = max(c for c in levels if c <= at)
        hi = min(c for c in levels if c >= at)
        f = 0.0 if hi == lo else (math.log2(at) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        rate = med[lo] + f * (med[hi] - med[lo])
        if rate > 0:
            out.append(OpenLoopLevel(**dict(edge), concurrency=cap, rate=round(rate, 4),
                                     rate_from=(lo, hi)))
    return out


def open_loop_lineup(plan: Sequence[OpenLoopLevel], policy_cfg: TrialConfig,
                     chosen: TrialConfig) -> tuple[list[tuple[Role, TrialConfig]], dict[int, str]]:
    """What the open-loop phase launches, as (role, config): the schedule, then every K of the
    bands at the planned edges as a static config (the chosen config at that K; K 0 the
    baseline), and {K: config key} for open_loop_check."""
    statics: dict[int, TrialConfig] = {}
    for edge in plan:
        for k in (edge.k_below, edge.k_above):
            statics[k] = (TrialConfig() if k == 0 else chosen if k == chosen.k
                          else chosen.with_k(k))
    lineup = [(Role.POLICY, policy_cfg)] + [(Role.BASELINE if k == 0 else Role.STATIC, cfg)
                                         for k, cfg in sorted(statics.items(), reverse=True)]
    return lineup, {k: cfg.key() for k, cfg in statics.items()}


def open_loop_check(plan: Sequence[OpenLoopLevel], ladder_runs: Sequence[LadderRun], *,
                    policy_key: str, static_keys: dict[int, str]) -> list[EdgeCheck]:
    """Per planned edge, the open-loop output throughput (median over repeats, relative MAD)
    of the schedule and of each static K of the two bands (`static_keys`: {K: config key},
    K 0 the baseline), the best static K, schedule over best, and whether the schedule dips
    below it beyond the spread (`dips`: the ratio under 1 by more than the two relative
    spreads added, MAD over median of each one's repeats, UNMEASURED_NOISE for a single run;
    a smaller difference is no finding). An edge not measured for the
    schedule or either K is not decided (`dips` None)."""
    pol = throughput_series(ladder_runs, policy_key)
    out = []
    for edge in plan:
        c = edge.concurrency
        policy = None
        if pol.get(c):
            policy = _figure(pol[c], throughput_series(ladder_runs, policy_key, TPOT)[c])
        static: dict[int, Figure] = {}
        for k in sorted({edge.k_below, edge.k_above}, reverse=True):
            xs = throughput_series(ladder_runs, static_keys[k]).get(c) \
                if k in static_keys else None
            if xs:
                static[k] = _figure(xs, throughput_series(ladder_runs, static_keys[k], TPOT)[c])
        row = EdgeCheck(**dict(edge), policy=policy, static=static)
        if policy is not None and len(static) == 2:
            best = max(static, key=lambda k: static[k].throughput)
            b = static[best]
            # The spread of a difference of two medians: both their spreads, added.
            ratio, noise = policy.throughput / b.throughput, policy.noise + b.noise
            row = row.model_copy(update={
                "best_k": int(best), "ratio": round(ratio, 4), "noise": round(noise, 4),
                "dips": ratio < 1.0 - noise,
                "policy_minus_best": round(policy.throughput - b.throughput, 3)})
        out.append(row)
    return out


TPOT = "mean_tpot_ms"


def _figure(xs: Sequence[float], tpots: Sequence[float]) -> Figure:
    """Output throughput (median, relative MAD, spread in tok/s) over the repeats, and the
    median mean TPOT beside it (what open-loop load shows first; not what decides)."""
    m = measured(xs)
    return Figure(throughput=round(m.value, 3), noise=round(m.relative_spread, 4),
                  spread=round(m.spread, 3), n=len(xs),
                  mean_tpot_ms=round(statistics.median(tpots), 3) if tpots else None)


def merge_cost(schedule: Sequence[Band], k_stats: dict[int, dict[int, LevelSpeedup]], *,
               edge: int, best_k: int) -> MergeCost | None:
    """What merging the bands at a dipping `edge` into its best static K would give up on
    the closed-loop ladder: the first level of the band whose K it replaces where that K
    measured (or was predicted) faster than the best K beyond the noise (K 0: speedup 1);
    None where it gives up nothing. `k_stats`: {K: {level: speedup and noise}}
    (draft_policy's)."""
    i = next(i for i, b in enumerate(schedule[:-1]) if b[1] == edge)
    lo, hi, k = schedule[i + 1] if schedule[i][2] == best_k else schedule[i]

    def stat(kk: int, c: int) -> LevelSpeedup | None:
        return LevelSpeedup(speedup=1.0, noise=0.0) if kk == 0 else k_stats.get(kk, {}).get(c)

    for c in sorted(k_stats.get(k, {}) if k else {c for st in k_stats.values() for c in st}):
        if not lo <= c <= hi:
            continue
        old, new = stat(k, c), stat(best_k, c)
        if old is None:
            continue
        if new is None or new.speedup < old.speedup * (1 - max(old.noise, new.noise)):
            return MergeCost(concurrency=c, k=k, speedup=round(old.speedup, 4),
                             merged_k=best_k,
                             merged_speedup=None if new is None else round(new.speedup, 4))
    return None


def merged_at_dips(schedule: Sequence[Band], edges: Sequence[EdgeCheck]) -> list[Band]:
    """The schedule with the two bands at every edge that dipped merged into one band of the
    K that measured better there (hysteresis by construction: no K flip is left where one
    cost throughput), unless the edge says the merge would give up a closed-loop gain
    (`gives_up`, merge_cost). Left to right, so K still never rises with load: each merged
    K lies between its neighbours'."""
    out = [list(b) for b in schedule]
    for edge in edges:
        if not edge.dips or edge.gives_up is not None or edge.best_k is None:
            continue
        i = next((i for i, b in enumerate(out[:-1]) if b[1] == edge.edge), None)
        if i is None:  # the edge was merged away already
            continue
        out[i:i + 2] = [[out[i][0], out[i + 1][1], edge.best_k]]
    merged: list[list[int]] = []
    for b in out:
        if merged and merged[-1][2] == b[2]:
            merged[-1][1] = b[1]
        else:
            merged.append(b)
    return [(s, e, k) for s, e, k in merged]


def with_open_loop(doc: PolicyDocument, edges: Sequence[EdgeCheck], static: TrialConfig, *,
                   varying_k: tuple[bool, str] | None = None) -> PolicyDocument:
    """The document with its open-loop check (`open_loop`: edges, dipped, the schedule as
    verified and as revised) and, where an edge dipped and the merge gives up no closed-loop
    gain (merge_cost; else the edge is kept, `kept_at`, with what it would give up under
    `gives_up`), the revised schedule in its place:
    `schedule`, `bands` and `speculative_config` (policy_config's of `static`, the config the
    schedule replaces, so one K left everywhere is a static config, and K 0 everywhere no
    speculation). The closed-loop verification stays, about the schedule it measured
    (`schedule_verified`)."""
    return doc.model_copy(update=open_loop_revision(doc.schedule, doc.k_stats, edges, static,
                                                    varying_k=varying_k))


def open_loop_revision(schedule: Sequence[Band] | None,
                       k_stats: dict[int, dict[int, LevelSpeedup]], edges: Sequence[EdgeCheck],
                       static: TrialConfig, *, varying_k: tuple[bool, str] | None = None
                       ) -> dict[str, Any]:
    """with_open_loop's fields of the document (of its `schedule` and `k_stats`), for the
    caller that builds it once."""
    before = [(s, e, k) for s, e, k in schedule or ()]
    edges = [e.model_copy(update={"gives_up": merge_cost(
        before, k_stats, edge=e.edge, best_k=e.best_k)})
        if e.dips and e.best_k is not None else e for e in edges]
    after = merged_at_dips(before, edges)
    revised = after != before
    block = OpenLoop(edges=tuple(edges), dipped_at=tuple(e.edge for e in edges if e.dips),
                     kept_at=tuple(e.edge for e in edges if e.dips and e.gives_up),
                     unmeasured_at=tuple(e.edge for e in edges if e.dips is None),
                     revised=revised, schedule_verified=tuple(before),
                     schedule_revised=tuple(after) if revised else None)
    if not revised:
        return {"open_loop": block}
    cfg = policy_config(static, after, varying_k=varying_k)
    return {"open_loop": block, "schedule": tuple(after), "bands": tuple(after),
            "speculative_config": None if cfg is None else cfg.speculative_config}


