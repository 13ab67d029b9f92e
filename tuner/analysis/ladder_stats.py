"""Analysis stage, the ladder's figures: per config key the series its measured runs give
(output throughput, drafts, the engine path it logged), and per concurrency level the speedup
over the baseline with its noise (and, beside an aligned baseline, its split into path cost x
speculation gain), and whether it pays or loses beyond that noise. Pure functions of
tuner.records.policy.LadderRun; the policy's rules (tuner.analysis.schedule, policy,
schedule_verification, open_loop) are written over them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from tuner.analysis import decomposition
from tuner.analysis.noise import UNMEASURED_NOISE
from tuner.records.policy import LadderRun, LevelSpeedup, LevelStat
from tuner.records.speedup import Measured, SpeedupSplit


def level_stats(throughputs: dict[int, Sequence[float]],
                baseline: dict[int, Sequence[float]]) -> dict[int, LevelStat]:
    """Per level: median speedup over the baseline and the relative noise (larger MAD/median
    of the two series, or UNMEASURED_NOISE with a single measurement)."""
    out = {}
    for c in sorted(throughputs):
        xs, bs = list(throughputs[c]), list(baseline.get(c, ()))
        if not xs or not bs:
            continue
        x, b = measured(xs), measured(bs)
        ratio = x.over(b)
        out[c] = LevelStat(speedup=ratio.value, noise=ratio.relative_spread,
                           throughput=x.value, baseline=b.value, n=len(xs), n_baseline=len(bs))
    return out


def measured(xs: Sequence[float]) -> Measured:
    """A series of runs as its median and relative noise (_rel_mad)."""
    return Measured(value=statistics.median(xs), relative_spread=_rel_mad(xs))


def _rel_mad(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return UNMEASURED_NOISE
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    # A MAD of two runs understates the spread; never claim less than 1%.
    return max(mad / med if med > 0 else math.inf, 0.01)


def split_stats(throughputs: dict[int, Sequence[float]], baseline: dict[int, Sequence[float]],
                aligned: dict[int, Sequence[float]]) -> dict[int, LevelStat]:
    """level_stats over the plain baseline with, at each level where the aligned baseline was
    measured too, the split (tuner.analysis.decomposition.policy_stats): path_cost (aligned
    over plain) and speculation_gain (the config over aligned), each with its noise. The
    medians' ratios multiply back exactly: speedup = path_cost x speculation_gain."""
    out = {}
    for c, stat in level_stats(throughputs, baseline).items():
        split = None
        if aligned.get(c):
            split = SpeedupSplit.of(measured(throughputs[c]), plain=measured(baseline[c]),
                                    aligned=measured(aligned[c]))
        out[c] = decomposition.policy_stats(stat, split)
    return out


def pays(stat: LevelSpeedup) -> bool:
    return stat.speedup > 1.0 + stat.noise


def loses(stat: LevelSpeedup) -> bool:
    return stat.speedup < 1.0 - stat.noise


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def throughput_series(ladder_runs: Sequence[LadderRun], key: str,
                      metric: str = "output_throughput") -> dict[int, list[float]]:
    """{concurrency: [value per successful run]} for one config key; `metric`: a
    LevelMetrics field."""
    out: dict[int, list[float]] = {}
    for run in ladder_runs:
        if run.key != key or run.result is None:
            continue
        for lv in run.result.levels:
            out.setdefault(lv.concurrency, []).append(float(getattr(lv, metric)))
    return out


def drafts_series(ladder_runs: Sequence[LadderRun], key: str) -> dict[int, list[float]]:
    return throughput_series(ladder_runs, key, "spec_decode_num_drafts")


def engine_details(ladder_runs: Sequence[LadderRun], key: str) -> dict[str, str]:
    """The engine path a config's first measured run logged (EngineInfo.details); {} where no
    run of it was measured."""
    return next((dict(run.result.engine.details) for run in ladder_runs
                 if run.key == key and run.result is not None), {})


