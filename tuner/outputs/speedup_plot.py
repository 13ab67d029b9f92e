"""Outputs stage, the speedup plot: throughput speedup over the baseline against concurrency
for the leading configs; with an aligned baseline, two panels that split the speedup into the
engine path's cost and speculation's own gain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tuner.analysis.frame import is_aligned_baseline
from tuner.analysis.pareto import Points
from tuner.outputs import figures
from tuner.records.recommendations import Recommendation


def speedup_plot(
    points: Points, out_dir: Path, *, workload: str = "", top_n: int = 4,
    recommendations: Sequence[Recommendation] = (), notes: list[str] | None = None,
) -> list[Path]:
    """Throughput speedup over the baseline against concurrency for the leading configs. With
    an aligned baseline, two panels: the speedup over the plain baseline with the engine
    path's cost as its own line, and speculation's gain over the aligned baseline; error bars
    are the run-to-run spreads (tuner.analysis.decomposition), where repeats measured them."""
    import seaborn as sns

    sp = points.measured
    spec = sp[(sp["method"] != "none") & sp["speedup_throughput"].notna()]
    if spec.empty:
        figures.note(notes, "Speedup vs concurrency: needs a baseline and at least one "
                            "completed speculative trial at the same concurrency.")
        return []
    leaders = figures.leading_configs(spec, top_n=top_n, recommendations=recommendations)
    data = spec[spec["config_key"].isin(leaders)].drop_duplicates(["config_key", "concurrency"])
    data = data.assign(config=data["label"].map(lambda s: figures.wrap(s, 30)))
    order = [data.loc[data["config_key"] == k, "config"].iloc[0] for k in leaders]
    aligned = sp[is_aligned_baseline(sp) & sp["path_cost"].notna()].drop_duplicates(
        "concurrency").sort_values("concurrency")
    series = _Series(data=data, order=order, aligned=aligned,
                     colors=dict(zip(order, sns.color_palette("colorblind", len(order)),
                                     strict=True)))
    with sns.axes_style("whitegrid"):
        fig = figures.figure(13.0 if series.split else 8.6, 4.8)
        axes = fig.subplots(1, 2 if series.split else 1, sharey=True, squeeze=False)[0]
        series.draw(axes)
        _ratio_axes(axes, levels=sorted(sp["concurrency"].unique()), series=series)
        title = figures.title(f"Where speculation pays: top {len(leaders)} configs", workload)
        if series.split:
            fig.suptitle(title)
            _one_legend(axes)
        else:
            axes[0].set_title(title)
            figures.legend_outside(axes[-1], title="config")
        return [figures.save(fig, Path(out_dir) / "speedup_vs_concurrency.png")]


@dataclass(frozen=True)
class _Series:
    """The speedup plot's lines: the leading configs' rows, in legend order with a colour
    each, and the aligned baseline's rows (the engine path's cost), which split the plot in
    two panels where the study measured it."""

    data: pd.DataFrame
    order: list[str]
    aligned: pd.DataFrame
    colors: dict[str, figures.Color]

    @property
    def split(self) -> bool:
        return not self.aligned.empty

    @property
    def total(self) -> tuple[str, str | None]:
        """The column of the total speedup and of its spread."""
        return ("total_speedup", "total_speedup_spread") if self.split else (
            "speedup_throughput", None)

    def draw(self, axes: Sequence[Any]) -> None:
        total = axes[0]
        total.axhline(1.0, color=figures.BASELINE_COLOR, ls="--", lw=1.3,
                      label="plain baseline (no speculation)" if self.split else
                      "baseline (no speculation)")
        col, err = self.total
        for name in self.order:
            _ratio_line(total, self.data[self.data["config"] == name], col, err, name,
                        self.colors[name])
        if not self.split:
            return
        _ratio_line(total, self.aligned, "path_cost", "path_cost_spread",
                    "engine path cost:\naligned baseline over plain", figures.BASELINE_COLOR,
                    ls=":", marker="D")
        gain = axes[1]
        gain.axhline(1.0, color=figures.BASELINE_COLOR, ls=":", lw=1.3,
                     label="aligned baseline (speculative\npath, no speculation)")
        for name in self.order:
            _ratio_line(gain, self.data[self.data["config"] == name], "speculation_gain",
                        "speculation_gain_spread", None, self.colors[name])
        gain.set_title("speculation alone: over the aligned baseline", fontsize="medium")
        total.set_title("total: over the plain baseline = path cost \u00d7 speculation",
                        fontsize="medium")

    def shown(self) -> list[pd.Series]:
        """Every value drawn, for the y range."""
        col = self.total[0]
        if not self.split:
            return [self.data[col]] * 3
        return [self.data[col], self.data["speculation_gain"], self.aligned["path_cost"]]


def _ratio_axes(axes: Sequence[Any], *, levels: list[Any], series: _Series) -> None:
    """Concurrency on x (log 2 where the levels span 4x or more), the ratio's range on y."""
    lo = min(float(v.min()) for v in series.shown())
    hi = max(float(v.max()) for v in series.shown())
    for ax in axes:
        if len(levels) > 1 and max(levels) / min(levels) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(int(c)) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrency (requests in flight)")
    axes[0].set_ylim(min(0.9, lo - 0.1), max(1.1, hi + 0.15))
    axes[0].set_ylabel("output throughput ratio (\u00d7)" if series.split else
                       "output throughput vs baseline (\u00d7)")


def _one_legend(axes: Sequence[Any]) -> None:
    """One legend for both panels, right of the second: the configs and both baselines."""
    total, gain = axes
    figures.legend_outside(total, title="config")
    handles, labels = total.get_legend_handles_labels()
    total.get_legend().remove()
    more = gain.get_legend_handles_labels()
    handles, labels = handles + more[0][:1], labels + more[1][:1]
    gain.legend(handles, labels, title="config", loc="upper left", bbox_to_anchor=(1.02, 1.0),
                borderaxespad=0.0, frameon=False, fontsize="small", title_fontsize="small")


def _ratio_line(ax: Any, rows: pd.DataFrame, col: str, err: str | None, label: str | None,
                color: Any, *, ls: str = "-", marker: str = "o") -> None:
    """One series of ratios against concurrency, with its spread as error bars where known."""
    rows = rows[rows[col].notna()].sort_values("concurrency")
    if rows.empty:
        return
    yerr = rows[err].fillna(0.0).to_numpy(float) if err else None
    ax.errorbar(rows["concurrency"].astype(float), rows[col].astype(float), yerr=yerr,
                label=label, color=color, ls=ls, marker=marker, markersize=7, lw=1.8,
                capsize=3, elinewidth=1.0)
