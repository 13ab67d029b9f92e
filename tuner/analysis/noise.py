"""Analysis stage, the noise a gain over the baseline is held against: the spread of the
config's and the baseline's repeats (relative MAD), never less than MIN_DIFFERENCE; for a
config measured once, the level's noisiest repeated speculative config, or how far its speedup
moved across the windows it shares with the baseline, or its own unsettled windows; and
UNMEASURED_NOISE where nothing was re-measured. tuner.analysis.recommend holds each gain to
it (noise_floor) and records which it was (noise_of), which tuner.outputs.verdicts words.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd

from tuner.analysis import frame
from tuner.records.recommendations import Noise, ThroughputSpread, WindowSpread

# Without repeats the spread is unknown: single runs on shared machines differ by a few
# percent, so a gain up to this is not evidence.
UNMEASURED_NOISE = 0.05
# The smallest throughput gain counted as a finding even where the measured spread is smaller:
# a MAD of two or three runs understates the spread (of two runs it is half their gap; two
# identical runs give zero), and tuner.analysis.ladder_stats never claims less than 1% for
# either of the two series a speedup divides, so their ratio is not known better than 2%.
MIN_DIFFERENCE = 0.02


def noise_floor(spread_rel: float | None) -> float:
    """The gain over the baseline (a fraction) a config must exceed for its difference to be
    a finding: the measured relative spread, never less than MIN_DIFFERENCE; UNMEASURED_NOISE
    when neither the config nor the baseline was re-measured."""
    return UNMEASURED_NOISE if spread_rel is None else max(spread_rel, MIN_DIFFERENCE)


def _relative_mad(row: pd.Series) -> float | None:
    return frame.optional(frame.relative_spread(row))


def single_run_spread(level: pd.DataFrame) -> float:
    """The spread taken for a speculative config measured once: the largest relative MAD of
    the level's repeated speculative configs, never less than UNMEASURED_NOISE. A speculative
    engine can be noisier than the baseline (on the H200, two runs of one n-gram config
    differed by 24% where the baseline's differed by 5%), so the baseline's spread alone
    would pass a single lucky run as a finding."""
    spec = level[(level["method"] != "none") & (level["n_measurements"].fillna(0) >= 2)]
    rels = [r for _, row in spec.iterrows() if (r := _relative_mad(row)) is not None]
    return max([UNMEASURED_NOISE, *rels])


def throughput_spread(win: pd.Series, base: pd.Series, *, single_run_spread: float
                      ) -> ThroughputSpread:
    """The spread `win`'s gain over `base` is held against, and its parts (`single_run_spread`:
    the level's, for a config measured once)."""
    own = _relative_mad(win)
    rels = [r for r in (own, _relative_mad(base)) if r is not None]
    single = unsettled = paired = None
    if rels and win["method"] != "none" and own is None:
        # Measured once, beside a re-measured baseline: no surer than its speedup moved
        # across the windows it shares with the baseline (the same requests), or, for a
        # study stored before the schedule, than its own windows where they did not settle.
        paired = _paired_window_spread(win, base)
        unsettled = None if paired is not None else _unsettled_spread(win)
        single = max(single_run_spread, paired or unsettled or 0.0)
        rels.append(single)
    return ThroughputSpread(
        output_throughput_median=frame.optional(win["output_throughput_median"]),
        output_throughput_mad=frame.optional(win["output_throughput_mad"]),
        mean_tpot_ms_median=frame.optional(win["mean_tpot_ms_median"]),
        mean_tpot_ms_mad=frame.optional(win["mean_tpot_ms_mad"]),
        baseline_output_throughput_mad=frame.optional(base["output_throughput_mad"]),
        relative_throughput_spread=max(rels) if rels else None,
        noise_floor=noise_floor(max(rels) if rels else None), single_run_spread=single,
        paired_window_spread=paired, unsettled_spread=unsettled)


def _paired_window_spread(win: pd.Series, base: pd.Series) -> float | None:
    """How far `win`'s speedup over `base` moves within the level, a fraction: half the range
    over the median of the per-window throughput ratios, window j of both launches holding
    the same requests (tuner.measure.windows; equal prompts digests). None where the two
    levels were not measured on the same requests or carry fewer than two windows."""
    digest = win.get("prompts_digest")
    if not isinstance(digest, str) or digest != base.get("prompts_digest"):
        return None
    a, b = win.get("windows"), base.get("windows")
    if not isinstance(a, (tuple, list)) or not isinstance(b, (tuple, list)) \
            or len(a) != len(b) or len(a) < 2:
        return None
    ratios = sorted(x / y for x, y in zip(a, b, strict=True)
                    if math.isfinite(x) and math.isfinite(y) and y > 0)
    if len(ratios) < 2:
        return None
    return (ratios[-1] - ratios[0]) / 2 / statistics.median(ratios)


def _unsettled_spread(row: pd.Series) -> float | None:
    """How far the windows of a level that did not converge moved (a fraction), the figure
    of its one launch moving as much; None where it converged or had no windows. On the
    H100 a leader measured once at 1.19x had windows that never settled (±22.7%), and the
    plain baseline's two launches measured 519 and 574 tok/s."""
    pct, settled = _windows(row)
    return None if pct is None or settled else pct / 100.0


def _windows(row: pd.Series) -> tuple[float | None, bool]:
    """A row's window spread in percent (None: measured without windows) and whether its
    windows settled (a level stored before windows counts as settled)."""
    converged = row.get("converged")
    return (frame.optional(row.get("stability_pct")),
            not (isinstance(converged, (bool, np.bool_)) and not converged))


def window_spreads(win: pd.Series, base: pd.Series) -> tuple[WindowSpread, ...]:
    """Where the two rows' levels were measured in windows (tuner.measure.windows): how far
    each launch's own windows spread, and whether they settled."""
    out = []
    for row, who in ((win, str(win["label"])), (base, "the baseline")):
        pct, settled = _windows(row)
        if pct is not None:
            out.append(WindowSpread(label=who, pct=pct, settled=settled))
    return tuple(out)



def noise_of(spread: ThroughputSpread) -> Noise:
    """Which spread the gain was held against: the one throughput_spread took as the largest."""
    spread_rel = spread.relative_throughput_spread
    if spread_rel is None:
        return Noise.UNMEASURED
    for taken, noise in ((spread.paired_window_spread, Noise.PAIRED_WINDOWS),
                         (spread.unsettled_spread, Noise.UNSETTLED_WINDOWS),
                         (spread.single_run_spread, Noise.SINGLE_RUN)):
        if taken is not None and spread_rel == taken:
            return noise
    return Noise.MEASURED if spread_rel >= MIN_DIFFERENCE else Noise.FLOOR


