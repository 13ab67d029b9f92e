"""Analysis stage, the engine path and speculation: where a study measured an aligned baseline
(no speculation on the speculative configs' engine path), a speedup over the plain baseline is
the path's cost x speculation's own gain. The arithmetic is tuner.records.results.SpeedupSplit's, one
copy that the replay's predictions use too; here it is applied to a frame's rows, to a
recommendation and to the policy's ladder, under the names each document keeps, and put in
the sentences that carry it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from tuner.analysis import frame
from tuner.records.policy import LevelStat
from tuner.records.speedup import ConfigSplit, Measured, SpeedupSplit

# Each ratio and its spread in the ratio's units: the frame's columns, and the keys of a
# recommendation's `decomposition` (recommendation.json).
RATIOS = ("total_speedup", "path_cost", "speculation_gain")
COLUMNS = tuple(c for r in RATIOS for c in (r, f"{r}_spread"))
# The policy's ladder stats, whose ratios carry their relative spread as "noise"
# (tuner.analysis.ladder_stats): the split's keys in policy.json.
POLICY_KEYS = {"path_cost": ("path_cost", "path_noise"),
               "speculation_gain": ("speculation_gain", "gain_noise")}


def columns(split: SpeedupSplit) -> dict[str, float]:
    """The split as COLUMNS: each ratio's value and its spread in the ratio's units."""
    out = {}
    for name in RATIOS:
        ratio: Measured = getattr(split, name)
        out[name], out[f"{name}_spread"] = ratio.value, ratio.spread
    return out


def measured(row: Any) -> Measured:
    """A frame row's throughput (its median where re-measured) with its relative spread."""
    return Measured(value=frame.number(row["output_throughput"]),
                    relative_spread=frame.relative_spread(row))


# --- a frame's rows ---------------------------------------------------------------------------
def decompose(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of `df` with COLUMNS where the study measured an aligned baseline at the row's
    level (NaN elsewhere, and for rows that did not complete).

    total_speedup = path_cost x speculation_gain, exactly: throughput over the plain baseline's
    (what a user gets today), the aligned baseline's over the plain one's (what the engine path
    the speculative configs run on costs without any speculation), and throughput over the
    aligned baseline's (what speculation alone gives). Medians where a config was re-measured,
    the earliest of each baseline, spreads as tuner.records.results.Measured.over; per study when `df`
    has several.
    """
    out = df.copy()
    for col in COLUMNS:
        out[col] = math.nan
    if df.empty:
        return out
    robust = frame.with_medians(df)
    keys = ["study", "concurrency"] if "study" in robust else ["concurrency"]
    plain = _earliest(robust, frame.is_baseline, keys)
    aligned = _earliest(robust, frame.is_aligned_baseline, keys)
    for i, row in robust.iterrows():
        at = tuple(row[k] for k in keys)
        split = _row_split(row, plain.get(at), aligned.get(at))
        if split is not None:
            out.loc[i, list(COLUMNS)] = list(columns(split).values())
    for col in COLUMNS:
        out[col] = pd.to_numeric(out[col])
    return out


def _earliest(robust: pd.DataFrame, role: Callable[[pd.DataFrame], pd.Series],
              keys: list[str]) -> dict[tuple, pd.Series]:
    """Per level (and study), the earliest completed trial of a baseline role."""
    rows = robust[role(robust)].sort_values("trial", kind="stable")
    # Reversed, so the earliest trial of each level is the one kept.
    return {tuple(r[k] for k in keys): r for _, r in rows.iloc[::-1].iterrows()}


def _row_split(row: pd.Series, plain: pd.Series | None, aligned: pd.Series | None
               ) -> SpeedupSplit | None:
    if row["state"] != "COMPLETE" or plain is None or aligned is None \
            or math.isnan(frame.number(row["output_throughput"])):
        return None
    return SpeedupSplit.of(measured(row), plain=measured(plain), aligned=measured(aligned))


# --- a recommendation -------------------------------------------------------------------------
def record(row: Mapping[str, Any]) -> ConfigSplit | None:
    """A row of `decompose` as a recommendation carries it (label and COLUMNS); None where the
    study has no aligned baseline at the row's level."""
    path_cost = frame.optional(row.get("path_cost"))
    if path_cost is None:
        return None
    return ConfigSplit(
        label=str(row["label"]), total_speedup=frame.optional(row.get("total_speedup")),
        total_speedup_spread=frame.optional(row.get("total_speedup_spread")),
        path_cost=path_cost, path_cost_spread=frame.optional(row.get("path_cost_spread")),
        speculation_gain=frame.optional(row.get("speculation_gain")),
        speculation_gain_spread=frame.optional(row.get("speculation_gain_spread")))


# --- the policy's ladder ----------------------------------------------------------------------
def policy_stats(stat: LevelStat, split: SpeedupSplit | None) -> LevelStat:
    """One ladder level's stats (speedup and noise over the plain baseline) with the split
    added under POLICY_KEYS, each ratio's noise its relative spread; unchanged without one."""
    if split is None:
        return stat
    update = {}
    for name, (value_key, noise_key) in POLICY_KEYS.items():
        ratio: Measured = getattr(split, name)
        update[value_key], update[noise_key] = ratio.value, ratio.relative_spread
    return stat.model_copy(update=update)
