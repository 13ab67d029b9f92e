"""Analysis stage, fronts and speedups: the Pareto front of throughput against per-token
latency per level, its knee, and every row's speedup against the no-speculation baseline of
the same study at the same concurrency (medians over repeats on both sides); and the measured
points with their fronts as the report draws them (`points`), computed once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tuner.analysis import decomposition, frame


def pareto_front(
    df_level: pd.DataFrame, *, x: str = "mean_tpot_ms", y: str = "output_throughput",
) -> pd.DataFrame:
    """The rows no other row beats: lower or equal `x` and higher or equal `y`, one strictly.

    Identical points do not dominate each other, so both stay on the front. Rows that are not
    COMPLETE or lack either value are ignored. Sorted by `x` ascending (then `y` descending).
    """
    if "concurrency" in df_level and df_level["concurrency"].dropna().nunique() > 1:
        raise ValueError("pareto_front needs rows of one concurrency level; filter first, e.g. "
                         "df[df.concurrency == 8].")
    ok = df_level
    if "state" in ok:
        ok = ok[ok["state"] == "COMPLETE"]
    xs = pd.to_numeric(ok[x], errors="coerce")
    ys = pd.to_numeric(ok[y], errors="coerce")
    keep = xs.notna() & ys.notna()
    ok, xv, yv = ok[keep], xs[keep].to_numpy(float), ys[keep].to_numpy(float)
    if ok.empty:
        return ok.copy()
    # dominated[i]: some j is at least as good on both and strictly better on one.
    no_worse = (xv[None, :] <= xv[:, None]) & (yv[None, :] >= yv[:, None])
    better = (xv[None, :] < xv[:, None]) | (yv[None, :] > yv[:, None])
    dominated = (no_worse & better).any(axis=1)
    front = ok[~dominated].copy()
    return front.sort_values([x, y], ascending=[True, False], kind="stable")


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with `speedup_throughput` (this / baseline) and `speedup_tpot` (baseline / this).

    The baseline is the completed no-speculation trial with role "baseline" of the same study
    at the same concurrency (the earliest when there are several); medians are used where a
    config was re-measured. Rows without such a baseline get NaN.
    """
    out = df.copy()
    robust = frame.with_medians(df)
    out["speedup_throughput"] = math.nan
    out["speedup_tpot"] = math.nan
    base = robust[frame.is_baseline(robust)].sort_values("trial")
    if base.empty:
        return out
    keys = ["study", "concurrency"] if "study" in robust else ["concurrency"]
    base = base.drop_duplicates(keys)[[*keys, *frame.SPREAD_METRICS]]
    merged = robust[keys].merge(base, on=keys, how="left", suffixes=("", "_base"))
    merged.index = robust.index
    complete = robust["state"] == "COMPLETE"
    out.loc[complete, "speedup_throughput"] = (
        robust["output_throughput"] / merged["output_throughput"])[complete]
    out.loc[complete, "speedup_tpot"] = (merged["mean_tpot_ms"] / robust["mean_tpot_ms"])[complete]
    out["speedup_throughput"] = pd.to_numeric(out["speedup_throughput"])
    out["speedup_tpot"] = pd.to_numeric(out["speedup_tpot"])
    return out


def knee(front: pd.DataFrame, *, x: str = "mean_tpot_ms", y: str = "output_throughput") -> Any:
    """Index of the front's knee: farthest from the chord joining its ends, both axes scaled
    to [0, 1]. With one or two points (no bend to find) the highest `y` wins."""
    if len(front) <= 2:
        by = [y, x, "trial"] if "trial" in front else [y, x]
        return front.sort_values(by, ascending=[False, True, True][: len(by)],
                                 kind="stable").index[0]
    xs = front[x].to_numpy(float)
    ys = front[y].to_numpy(float)
    xn = (xs - xs.min()) / ((xs.max() - xs.min()) or 1.0)
    yn = (ys - ys.min()) / ((ys.max() - ys.min()) or 1.0)
    (x0, y0), (x1, y1) = (xn[0], yn[0]), (xn[-1], yn[-1])
    dist = np.abs((x1 - x0) * (y0 - yn) - (x0 - xn) * (y1 - y0))
    if np.allclose(dist, 0.0):  # a straight front: no knee, take the most throughput
        return front.index[int(np.argmax(ys))]
    return front.index[int(np.argmax(dist))]


@dataclass(frozen=True)
class Points:
    """What the report's figures and tables draw, computed once (tuner.api hands it over).

    `measured`: every completed row with a level and a throughput, copies answered from
    storage left out, throughput and TPOT as medians where a config was re-measured, with its
    speedups and the split (tuner.analysis.decomposition.COLUMNS). `fronts`: per level, the
    Pareto front of those rows (pareto_front), by TPOT."""

    measured: pd.DataFrame
    fronts: dict[int, pd.DataFrame]


def points(df: pd.DataFrame) -> Points:
    """The Points of `df`, a trials_frame with its speedups (as tuner.api computes it)."""
    if not set(frame.SPEEDUP_COLUMNS) <= set(df.columns):
        raise ValueError("points needs the speedups: pass speedups(trials_frame(study)).")
    robust = frame.with_medians(decomposition.decompose(df))
    measured = robust[(robust["state"] == "COMPLETE") & robust["concurrency"].notna()
                      & robust["output_throughput"].notna()]
    if "duplicate_of" in measured:  # a copy would sit on its original
        measured = measured[measured["duplicate_of"].isna()]
    fronts = {int(c): pareto_front(measured[measured["concurrency"] == c])
              for c in sorted(measured["concurrency"].unique())}
    return Points(measured=measured, fronts=fronts)
