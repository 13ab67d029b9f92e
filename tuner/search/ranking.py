"""Search stage, the ranking the replay strategy's confirm launches reach (without a workload
sample): the leaders against the plain baseline, and the best against the runner-up, each by
its speedup interval (tuner.intervals), pooled over every config launched twice. Pure: the
launches' figures in, an intervals.Ranking out (tuner.outputs.ranking words it).
"""

from __future__ import annotations

from tuner import intervals
from tuner.records.configs import TrialConfig


def rank(*, leaders: list[TrialConfig], baselines: list[TrialConfig],
         throughputs: dict[str, list[float]],
         windows: dict[str, list[intervals.LaunchWindows]], target: int, margin: float,
         confidence: float) -> intervals.Ranking:
    """Decided once two comparisons are resolved by their speedup intervals
    (tuner.intervals.decide: above, below, or within `margin` of 1.00x): the best leader
    against the plain baseline (`baselines[0]`), and the best of leaders and baselines against
    the runner-up. `throughputs`: each config's output throughput at the `target` level, one
    figure per launch, by config key; `windows`: each launch's windows with the digest of the
    requests they hold. The between-launch spread is pooled over every config launched twice.
    An aligned baseline (`baselines[1]`) is ranked too (its ratio is the engine path's cost),
    with each leader's ratio to it, speculation's own gain, and its interval. Intervals are
    taken at `confidence`."""
    at = target
    pool = intervals.Pool.of(throughputs.values())

    def interval(a: TrialConfig, b: TrialConfig) -> intervals.Interval | None:
        """A's speedup over B, the paired within-level spread of their windows added
        (tuner.intervals.Within)."""
        within = intervals.Within.paired(windows.get(a.key(), ()), windows.get(b.key(), ()))
        return intervals.speedup(throughputs.get(a.key(), ()), throughputs.get(b.key(), ()),
                                 pool=pool, confidence=confidence, within=within)

    plain, ranked = baselines[0], [*baselines, *leaders]
    status = intervals.RankingStatus
    for cfg in ranked:
        n = len(throughputs.get(cfg.key(), ()))
        if not intervals.enough(n, pool):
            return intervals.Ranking(status.FEW_LAUNCHES, at, margin, short_of=cfg.label(),
                                     launches=n)
    if not leaders:
        return intervals.Ranking(status.NO_LEADER, at, margin)
    over = {cfg.key(): interval(cfg, plain) for cfg in ranked[1:]}
    points = {plain.key(): 1.0, **{k: iv.point for k, iv in over.items()}}
    order = sorted(ranked, key=lambda cfg: -points[cfg.key()])  # the plain one on ties
    best = max(leaders, key=lambda cfg: points[cfg.key()])
    first, second = order[0], order[1]
    pairs = [(best, plain, over[best.key()])]
    if {first.key(), second.key()} != {best.key(), plain.key()}:
        pairs.append((first, second, interval(first, second)))
    compared = tuple(intervals.Compared(x.label(), y.label(), iv, intervals.decide(iv, margin))
                     for x, y, iv in pairs)
    path, gains = None, ()
    if len(baselines) > 1:  # each leader's speedup as path cost x speculation gain
        aligned = baselines[1]
        path = intervals.Speedup(aligned.label(), interval(aligned, plain))
        gains = tuple(intervals.Speedup(cfg.label(), interval(cfg, aligned)) for cfg in leaders)
    opened = any(c.decision == intervals.OPEN for c in compared)
    return intervals.Ranking(
        status.OPEN if opened else status.DECIDED, at, margin, plain=plain.label(),
        best=intervals.Speedup(best.label(), over[best.key()]),
        first=None if first.key() == plain.key() else intervals.Speedup(
            first.label(), over[first.key()]),
        pairs=compared, over_plain=tuple(intervals.Speedup(cfg.label(), over[cfg.key()])
                                         for cfg in order if cfg.key() != plain.key()),
        pool=pool, path=path, gains=gains)
