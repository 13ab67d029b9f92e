"""Outputs stage, the Pareto plots: throughput against per-token latency at each concurrency
level, the measured configs by method, the front as a staircase, the baselines and the
recommended config marked, and the replay's predictions beside the measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from tuner.analysis.frame import is_aligned_baseline
from tuner.analysis.pareto import Points
from tuner.outputs import figures
from tuner.records.recommendations import Recommendation
from tuner.records.trials import Role


def pareto_plots(
    points: Points, out_dir: Path, *, workload: str = "",
    recommendations: Sequence[Recommendation] = (), notes: list[str] | None = None,
    predictions: pd.DataFrame | None = None,
) -> list[Path]:
    """One file per concurrency level: completed trials by method, the front as a step line,
    the baseline and the recommended config marked and labelled. With the replay's
    `predictions` (predicted.csv's rows), each predicted config is a hollow marker beside the
    measured ones, joined to its measurement by a thin line where it was measured; the front
    stays the measured one."""
    import seaborn as sns

    data = points.measured
    if data.empty:
        figures.note(notes, "Pareto fronts: no completed trial to plot yet.")
        return []
    recs = {r.concurrency: r for r in recommendations}
    predicted = _predicted(predictions)
    palette = figures.method_palette([*data["method"], *predicted["method"]])
    paths = []
    for c, front in points.fronts.items():
        lv = data[data["concurrency"] == c]
        pred = predicted[predicted["concurrency"] == c]
        with sns.axes_style("whitegrid"):
            fig = figures.figure(8.6, 5.2)
            ax = fig.add_subplot()
            sns.scatterplot(data=lv, x="mean_tpot_ms", y="output_throughput", hue="method",
                            palette=palette, s=55, alpha=0.85, edgecolor="white", ax=ax,
                            zorder=3)
            _draw_predicted(ax, pred, lv, palette)
            _mark_baselines(ax, lv)
            _mark_recommended(ax, lv, recs.get(c))
            ax.margins(x=0.15, y=0.15)
            _draw_front(ax, front)
            ax.set_xlabel("mean TPOT (ms)  \u2190 better")
            ax.set_ylabel("output throughput (tok/s)  \u2192 better")
            ax.set_title(figures.title("Throughput vs per-token latency", workload, c,
                                       n=lv["config_key"].nunique())
                         + (f" measured, {len(pred)} predicted" if len(pred) else ""))
            figures.legend_outside(ax, title="method")
            paths.append(figures.save(fig, Path(out_dir) / f"pareto_c{c}.png"))
    return paths


def _mark_baselines(ax: Any, lv: pd.DataFrame) -> None:
    """The plain baseline as a labelled square, the aligned one as a dashed diamond."""
    base = lv[(lv["method"] == "none") & (lv["role"] == Role.BASELINE)]
    if not base.empty:
        b = base.sort_values("trial").iloc[0]
        ax.scatter([b["mean_tpot_ms"]], [b["output_throughput"]], s=200, marker="s",
                   facecolor="none", edgecolor=figures.BASELINE_COLOR, lw=1.8, zorder=4,
                   label="baseline (no speculation)")
        _annotate(ax, b["mean_tpot_ms"], b["output_throughput"],
                  f"baseline\n{b['output_throughput']:.1f} tok/s", (-14, -8), "right", "top")
    aligned = lv[is_aligned_baseline(lv)]
    if not aligned.empty:
        a = aligned.sort_values("trial").iloc[0]
        ax.scatter([a["mean_tpot_ms"]], [a["output_throughput"]], s=170, marker="D",
                   facecolor="none", edgecolor=figures.BASELINE_COLOR, lw=1.4, ls="--",
                   zorder=4, label="aligned baseline (speculative path,\nno speculation)")


def _mark_recommended(ax: Any, lv: pd.DataFrame, rec: Recommendation | None) -> None:
    """A star on the recommended config, labelled with its speedup and split."""
    if rec is None or rec.status != "recommend" or rec.trial is None:
        return
    row = lv[lv["trial"] == rec.trial]
    if row.empty:
        return
    r = row.iloc[0]
    ax.scatter([r["mean_tpot_ms"]], [r["output_throughput"]], s=320, marker="*",
               facecolor="gold", edgecolor="black", lw=0.8, zorder=5, label="recommended")
    speed = f" ({rec.speedup_throughput:.2f}x baseline)" if rec.speedup_throughput else ""
    if rec.decomposition:  # the aligned baseline's split: path cost x speculation gain
        speed += "\n= " + rec.decomposition.split_text()
    # The upper right (slow yet fast) stays empty at a fixed concurrency, so the long label
    # goes there, under the front's top line (at 0.885 of the height with these margins),
    # and points at the star.
    ax.annotate(f"recommended{speed}\n{figures.wrap(rec.label or '', 34)}",
                (r["mean_tpot_ms"], r["output_throughput"]),
                xytext=(0.97, 0.84), textcoords="axes fraction", ha="right", va="top",
                fontsize="small", zorder=6,
                bbox={"boxstyle": "round,pad=0.3", "fc": "#fffbe6", "ec": "0.6"},
                arrowprops={"arrowstyle": "->", "color": "0.4", "lw": 0.9, "shrinkB": 9})


def _predicted(predictions: pd.DataFrame | None) -> pd.DataFrame:
    """The speculative predicted rows with both a throughput and a TPOT (the baseline's row
    is its measurement, already drawn; a row the step cost cannot price has no point)."""
    cols = ["key", "method", "concurrency", "pred_mean_tpot_ms", "pred_output_throughput"]
    if predictions is None or predictions.empty or not set(cols) <= set(predictions.columns):
        return pd.DataFrame(columns=cols)
    out = predictions[cols].copy()
    for col in ("concurrency", "pred_mean_tpot_ms", "pred_output_throughput"):
        out[col] = pd.to_numeric(out[col], errors="coerce")
    return out[(out["method"] != "none") & out["concurrency"].notna()
               & out["pred_mean_tpot_ms"].notna() & out["pred_output_throughput"].notna()]


def _draw_predicted(ax: Any, pred: pd.DataFrame, measured: pd.DataFrame,
                    palette: dict[str, figures.Color]) -> None:
    """Hollow markers in the method's colour, under the measured points; a thin line from a
    measured config to its own prediction shows the prediction's error at a glance."""
    if pred.empty:
        return
    ax.scatter(pred["pred_mean_tpot_ms"], pred["pred_output_throughput"], s=30, marker="o",
               facecolors="none", edgecolors=[palette.get(m, "0.5") for m in pred["method"]],
               lw=0.9, alpha=0.7, zorder=2.5)
    # One grey legend entry for every predicted point, whatever its method's colour.
    ax.scatter([], [], s=30, marker="o", facecolors="none", edgecolors="0.35", lw=0.9,
               label="predicted (replay)")
    points = measured[measured["method"] != "none"].drop_duplicates("config_key")
    joined = points.merge(pred, left_on="config_key", right_on="key",
                          suffixes=("", "_pred"))
    for _, r in joined.iterrows():
        ax.plot([r["mean_tpot_ms"], r["pred_mean_tpot_ms"]],
                [r["output_throughput"], r["pred_output_throughput"]],
                color=palette.get(r["method"], "0.5"), lw=0.8, alpha=0.6, zorder=2.4)
    if not joined.empty:
        ax.plot([], [], color="0.5", lw=0.8, label="measured \u2192 its prediction")


def _draw_front(ax: Any, front: pd.DataFrame) -> None:
    """The front as an attainment staircase run out to the axes, so even a one-point front
    shows the region it dominates (below and to the right)."""
    if front.empty:
        return
    ax.autoscale_view()
    (x_lo, x_hi), (y_lo, y_hi) = ax.get_xlim(), ax.get_ylim()
    xs = [front["mean_tpot_ms"].iloc[0], *front["mean_tpot_ms"], x_hi]
    ys = [y_lo, *front["output_throughput"], front["output_throughput"].iloc[-1]]
    ax.step(xs, ys, where="post", color="0.35", lw=1.2, ls="--", zorder=2,
            label="Pareto front")
    ax.fill_between(xs, ys, y_lo, step="post", color="0.5", alpha=0.07, zorder=1, lw=0)
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)


def _annotate(ax: Any, x: float, y: float, text: str, offset: tuple[int, int], ha: str,
              va: str) -> None:
    ax.annotate(text, (x, y), xytext=offset, textcoords="offset points", ha=ha, va=va,
                fontsize="small", zorder=6,
                bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.7", "alpha": 0.9},
                arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.8})
