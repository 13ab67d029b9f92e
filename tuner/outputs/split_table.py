"""Outputs stage, the engine path and speculation: where a study measured an aligned baseline
(no speculation on the speculative configs' engine path), each speedup over the plain baseline
is shown as path cost x speculation gain, each with its spread, in report.md and report.html:
a few rows per recommendation and one table over the leading configs and every level, from
what tuner.analysis.decomposition computed. Studies without an aligned baseline render
nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.analysis import frame
from tuner.outputs import text
from tuner.records.speedup import ratio_text

if TYPE_CHECKING:
    import pandas as pd

    from tuner.records.recommendations import Recommendation
    from tuner.records.speedup import ConfigSplit

_TOP_CONFIGS = 5
INTRO = ("Speedup over the plain baseline = engine path cost \u00d7 speculation gain. The "
         "aligned baseline runs the speculative configs' engine path without speculation: its "
         "throughput over the plain baseline's is what the path costs, and a config's "
         "throughput over the aligned baseline's is what speculation alone gives. \u00b1 is the "
         "run-to-run spread (MAD over repeats), left out where a config was measured once.")


def rec_rows(split: ConfigSplit | None) -> list[tuple[str, str]]:
    """(what, value) rows of one recommendation's decomposition; [] without one."""
    if split is None:
        return []
    return [("speedup over the plain baseline (what you get today)",
             ratio_text(split.total_speedup, split.total_speedup_spread)),
            ("= engine path cost (aligned baseline over plain)",
             ratio_text(split.path_cost, split.path_cost_spread)),
            ("\u00d7 speculation gain (this config over the aligned baseline)",
             ratio_text(split.speculation_gain, split.speculation_gain_spread))]


def table(measured: pd.DataFrame, recs: Sequence[Recommendation] = ()
          ) -> tuple[list[str], list[list[str]]] | None:
    """The study-wide table: the aligned baseline's row (the path cost at each level), then the
    recommended configs and the fastest others, each level as "over plain / over aligned".
    `measured` is tuner.analysis.pareto.Points.measured (its rows carry the split). None when
    the study measured no aligned baseline."""
    parts = measured[measured["path_cost"].notna()].drop_duplicates(["config_key",
                                                                      "concurrency"])
    if parts.empty:
        return None
    levels = sorted(int(c) for c in parts["concurrency"].unique())
    aligned = parts[frame.is_aligned_baseline(parts)]
    spec = parts[parts["method"] != "none"]
    chosen = {r.trial for r in recs if r.status == "recommend"}
    keys = list(dict.fromkeys(spec.loc[spec["trial"].isin(chosen), "config_key"]))
    best = spec.groupby("config_key")["total_speedup"].max().sort_values(ascending=False)
    keys += [k for k in best.index if k not in keys][: max(_TOP_CONFIGS - len(keys), 0)]
    head = ["config"] + [f"c={c}: over plain / over aligned" for c in levels]

    def row(rows: pd.DataFrame, label: str, *, is_aligned: bool = False) -> list[str]:
        cells = [label]
        for c in levels:
            at = rows[rows["concurrency"] == c]
            if at.empty:
                cells.append("-")
                continue
            r = at.iloc[0]
            # The aligned baseline over itself is 1 by definition: no spread to show.
            gain = "1.00x" if is_aligned else text.ratio(r, "speculation_gain")
            total = text.ratio(r, "total_speedup")
            cells.append(f"{total} / {gain}")
        return cells

    out = []
    if not aligned.empty:
        out.append(row(aligned, f"aligned baseline: the engine path alone "
                                f"({aligned['label'].iloc[0]})", is_aligned=True))
    for key in keys:
        rows = spec[spec["config_key"] == key]
        star = " \u2605" if set(rows["trial"]) & chosen else ""
        out.append(row(rows, str(rows["label"].iloc[0]) + star))
    return head, out
