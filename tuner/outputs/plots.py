"""Outputs stage, plots: seaborn figures drawn from the analysis frames, saved as PNG files.

Every figure is drawn from what tuner.analysis computed once (tuner.analysis.pareto.Points:
the measured points with their speedups, split and fronts; never raw storage, and nothing
recomputed here), has units on its axes, is drawn on its own Agg canvas rather than through
pyplot (nothing global to close or leak, and a notebook's backend is left alone), and is
written atomically. A plot whose data is missing writes nothing, returns [] and appends a note
saying why to `notes`.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from tuner.analysis.frame import is_aligned_baseline
from tuner.analysis.pareto import Points
from tuner.records.policy import BreakEvenStatus, PolicyDocument
from tuner.records.recommendations import Recommendation
from tuner.records.trials import Role

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Fixed colours per method, so one method looks the same in every figure of a report.
_METHOD_ORDER = ("ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp", "ngram_gpu",
                 "medusa", "mlp_speculator")
BASELINE_COLOR = "#3b3b3b"
# A colour as matplotlib takes it: an RGB triple (seaborn's palettes) or a colour string.
Color = tuple[float, float, float] | str
DPI = 130


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
        _note(notes, "Pareto fronts: no completed trial to plot yet.")
        return []
    recs = {r.concurrency: r for r in recommendations}
    predicted = _predicted(predictions)
    palette = method_palette([*data["method"], *predicted["method"]])
    paths = []
    for c, front in points.fronts.items():
        lv = data[data["concurrency"] == c]
        pred = predicted[predicted["concurrency"] == c]
        with sns.axes_style("whitegrid"):
            fig = _figure(8.6, 5.2)
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
            ax.set_title(_title("Throughput vs per-token latency", workload, c,
                                n=lv["config_key"].nunique())
                         + (f" measured, {len(pred)} predicted" if len(pred) else ""))
            _legend_outside(ax, title="method")
            paths.append(_save(fig, Path(out_dir) / f"pareto_c{c}.png"))
    return paths


def _mark_baselines(ax: Any, lv: pd.DataFrame) -> None:
    """The plain baseline as a labelled square, the aligned one as a dashed diamond."""
    base = lv[(lv["method"] == "none") & (lv["role"] == Role.BASELINE)]
    if not base.empty:
        b = base.sort_values("trial").iloc[0]
        ax.scatter([b["mean_tpot_ms"]], [b["output_throughput"]], s=200, marker="s",
                   facecolor="none", edgecolor=BASELINE_COLOR, lw=1.8, zorder=4,
                   label="baseline (no speculation)")
        _annotate(ax, b["mean_tpot_ms"], b["output_throughput"],
                  f"baseline\n{b['output_throughput']:.1f} tok/s", (-14, -8), "right", "top")
    aligned = lv[is_aligned_baseline(lv)]
    if not aligned.empty:
        a = aligned.sort_values("trial").iloc[0]
        ax.scatter([a["mean_tpot_ms"]], [a["output_throughput"]], s=170, marker="D",
                   facecolor="none", edgecolor=BASELINE_COLOR, lw=1.4, ls="--",
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
    ax.annotate(f"recommended{speed}\n{_wrap(rec.label or '', 34)}",
                (r["mean_tpot_ms"], r["output_throughput"]),
                xytext=(0.97, 0.84), textcoords="axes fraction", ha="right", va="top",
                fontsize="small", zorder=6,
                bbox={"boxstyle": "round,pad=0.3", "fc": "#fffbe6", "ec": "0.6"},
                arrowprops={"arrowstyle": "->", "color": "0.4", "lw": 0.9, "shrinkB": 9})


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
        _note(notes, "Speedup vs concurrency: needs a baseline and at least one completed "
                     "speculative trial at the same concurrency.")
        return []
    leaders = _leaders(spec, top_n=top_n, recommendations=recommendations)
    data = spec[spec["config_key"].isin(leaders)].drop_duplicates(["config_key", "concurrency"])
    data = data.assign(config=data["label"].map(lambda s: _wrap(s, 30)))
    order = [data.loc[data["config_key"] == k, "config"].iloc[0] for k in leaders]
    aligned = sp[is_aligned_baseline(sp) & sp["path_cost"].notna()].drop_duplicates(
        "concurrency").sort_values("concurrency")
    series = _Series(data=data, order=order, aligned=aligned,
                     colors=dict(zip(order, sns.color_palette("colorblind", len(order)),
                                     strict=True)))
    with sns.axes_style("whitegrid"):
        fig = _figure(13.0 if series.split else 8.6, 4.8)
        axes = fig.subplots(1, 2 if series.split else 1, sharey=True, squeeze=False)[0]
        series.draw(axes)
        _ratio_axes(axes, levels=sorted(sp["concurrency"].unique()), series=series)
        title = _title(f"Where speculation pays: top {len(leaders)} configs", workload)
        if series.split:
            fig.suptitle(title)
            _one_legend(axes)
        else:
            axes[0].set_title(title)
            _legend_outside(axes[-1], title="config")
        return [_save(fig, Path(out_dir) / "speedup_vs_concurrency.png")]


@dataclass(frozen=True)
class _Series:
    """The speedup plot's lines: the leading configs' rows, in legend order with a colour
    each, and the aligned baseline's rows (the engine path's cost), which split the plot in
    two panels where the study measured it."""

    data: pd.DataFrame
    order: list[str]
    aligned: pd.DataFrame
    colors: dict[str, Color]

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
        total.axhline(1.0, color=BASELINE_COLOR, ls="--", lw=1.3,
                      label="plain baseline (no speculation)" if self.split else
                      "baseline (no speculation)")
        col, err = self.total
        for name in self.order:
            _ratio_line(total, self.data[self.data["config"] == name], col, err, name,
                        self.colors[name])
        if not self.split:
            return
        _ratio_line(total, self.aligned, "path_cost", "path_cost_spread",
                    "engine path cost:\naligned baseline over plain", BASELINE_COLOR,
                    ls=":", marker="D")
        gain = axes[1]
        gain.axhline(1.0, color=BASELINE_COLOR, ls=":", lw=1.3,
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
    _legend_outside(total, title="config")
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


def acceptance_plot(
    points: Points, out_dir: Path, *, workload: str = "", notes: list[str] | None = None,
) -> list[Path]:
    """Mean acceptance length against num_speculative_tokens, by method."""
    import seaborn as sns

    data = points.measured
    data = data[(data["method"] != "none") & data["num_speculative_tokens"].notna()
                & data["spec_decode_acceptance_length"].notna()]
    if data.empty:
        _note(notes, "Acceptance length vs k: no completed speculative trial reported "
                     "acceptance (num_speculative_tokens and vLLM's spec-decode counters).")
        return []
    data = data.assign(k=pd.to_numeric(data["num_speculative_tokens"]),
                       level=data["concurrency"].map(lambda c: f"c={int(c)}"))
    ks = sorted(data["k"].unique())
    with sns.axes_style("whitegrid"):
        fig = _figure(8.6, 4.8)
        ax = fig.add_subplot()
        ax.plot([0, max(ks)], [1, max(ks) + 1], color="0.6", ls=":", lw=1.2,
                label="upper bound (k + 1)")
        palette = method_palette(data["method"])
        sns.lineplot(data=data, x="k", y="spec_decode_acceptance_length", hue="method",
                     palette=palette, errorbar=None, lw=1.2, alpha=0.6, ax=ax, legend=False)
        sns.scatterplot(data=data, x="k", y="spec_decode_acceptance_length", hue="method",
                        palette=palette, style="level", s=60, ax=ax, zorder=3)
        ax.set_xlim(0.5, max(ks) + 0.5)
        ax.set_ylim(1.0, max(data["spec_decode_acceptance_length"].max() * 1.15, 2.0))
        ax.set_xticks(ks if len(ks) <= 16 else ks[:: max(1, len(ks) // 12)])
        ax.set_xlabel("num_speculative_tokens k (draft tokens per step)")
        ax.set_ylabel("mean acceptance length (tokens/step)")
        ax.set_title(_title("Acceptance length vs draft length", workload))
        _legend_outside(ax)
        return [_save(fig, Path(out_dir) / "acceptance_length.png")]


def per_position_plot(
    points: Points, out_dir: Path, *, workload: str = "", top_n: int = 4,
    recommendations: Sequence[Recommendation] = (), notes: list[str] | None = None,
) -> list[Path]:
    """Acceptance rate at each draft position for the leading configs, one panel per level."""
    import seaborn as sns

    sp = points.measured
    col = "spec_decode_per_position_acceptance_rates"
    has = sp[col].map(lambda v: isinstance(v, (list, tuple)) and len(v) > 0)
    spec = sp[(sp["method"] != "none") & has]
    if spec.empty:
        _note(notes, "Per-position acceptance: no completed trial reported per-position "
                     "acceptance counts.")
        return []
    ranked = spec.assign(speedup_throughput=spec["speedup_throughput"].fillna(0))
    leaders = _leaders(ranked, top_n=top_n, recommendations=recommendations)
    rows = []
    for _, r in spec[spec["config_key"].isin(leaders)].drop_duplicates(
            ["config_key", "concurrency"]).iterrows():
        for pos, rate in enumerate(r[col], start=1):
            rows.append({"config": _wrap(r["label"], 30), "key": r["config_key"],
                         "concurrency": int(r["concurrency"]), "position": pos,
                         "rate_pct": 100.0 * float(rate)})
    long = pd.DataFrame(rows)
    order = [long.loc[long["key"] == k, "config"].iloc[0] for k in leaders
             if (long["key"] == k).any()]
    levels = sorted(long["concurrency"].unique())[:4]
    with sns.axes_style("whitegrid"):
        fig = _figure(max(4.6 * len(levels), 7.0), 5.4)
        axes = fig.subplots(1, len(levels), sharey=True, squeeze=False)[0]
        for ax, c in zip(axes, levels, strict=True):
            sns.lineplot(data=long[long["concurrency"] == c], x="position", y="rate_pct",
                         hue="config", hue_order=order, style="config", style_order=order,
                         markers=True, dashes=False, palette="colorblind", ax=ax,
                         legend=ax is axes[-1])
            ax.set_title(f"concurrency {c}")
            ax.set_xlabel("draft position")
            ax.set_ylim(0, 100)
            ax.xaxis.get_major_locator().set_params(integer=True)
        axes[0].set_ylabel("acceptance rate at position (%)")
        fig.suptitle(_title("Per-position acceptance of the leading configs", workload))
        # Below the panels, not beside them: the figure stays narrow enough to read in a page.
        handles, labels = axes[-1].get_legend_handles_labels()
        if axes[-1].get_legend() is not None:
            axes[-1].get_legend().remove()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 2),
                   frameon=False, fontsize="small")
        return [_save(fig, Path(out_dir) / "acceptance_per_position.png")]


def draw_all(
    points: Points, out_dir: Path, *, workload: str = "",
    recommendations: Sequence[Recommendation] = (), predictions: pd.DataFrame | None = None,
) -> tuple[dict[str, list[Path]], list[str]]:
    """Every figure of a report from `points` (tuner.analysis.pareto.points): {plot name:
    paths} and the notes for plots left out. `predictions` (the replay's predicted table) adds
    predicted points to the Pareto fronts."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    drawn = {
        "pareto": pareto_plots(points, out_dir, recommendations=recommendations,
                               predictions=predictions, workload=workload, notes=notes),
        "speedup": speedup_plot(points, out_dir, recommendations=recommendations,
                                workload=workload, notes=notes),
        "acceptance": acceptance_plot(points, out_dir, workload=workload, notes=notes),
        "per_position": per_position_plot(points, out_dir, recommendations=recommendations,
                                          workload=workload, notes=notes),
    }
    return drawn, notes


def method_palette(methods: Iterable[str]) -> dict[str, Color]:
    """A colour per method, the same in every figure; the baseline is dark grey."""
    import seaborn as sns

    colors = sns.color_palette("colorblind", 10)
    present = set(methods)
    known = [m for m in _METHOD_ORDER if m in present]
    others = sorted(present - set(_METHOD_ORDER) - {"none"})
    palette = {m: colors[i % 10] for i, m in enumerate(known + others)}
    if "none" in present:
        palette["none"] = BASELINE_COLOR
    return palette


# --- shared drawing bits ------------------------------------------------------------------


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
                    palette: dict[str, Color]) -> None:
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


def _leaders(spec: pd.DataFrame, *, top_n: int,
             recommendations: Sequence[Recommendation]) -> list[str]:
    """Config keys: the recommended ones first, then by best speedup over any level."""
    keys: list[str] = []
    for rec in recommendations:
        if rec.status == "recommend" and rec.trial is not None:
            hit = spec.loc[spec["trial"] == rec.trial, "config_key"]
            if not hit.empty and hit.iloc[0] not in keys:
                keys.append(hit.iloc[0])
    best = spec.groupby("config_key")["speedup_throughput"].max().sort_values(ascending=False)
    for key in best.index:
        if len(keys) >= max(top_n, 1):
            break
        if key not in keys:
            keys.append(key)
    return keys


def _figure(width_in: float, height_in: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """Write the PNG beside its final name, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        fig.clear()  # drops the artists now; the canvas is private, nothing global to close
    return path


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


def _legend_outside(ax: Any, *, title: str | None = None) -> None:
    """Legend to the right of the axes, so it never covers a point."""
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    if handles:
        ax.legend(handles, labels, title=title, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  borderaxespad=0.0, frameon=False, fontsize="small", title_fontsize="small")


def _annotate(ax: Any, x: float, y: float, text: str, offset: tuple[int, int], ha: str,
              va: str) -> None:
    ax.annotate(text, (x, y), xytext=offset, textcoords="offset points", ha=ha, va=va,
                fontsize="small", zorder=6,
                bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.7", "alpha": 0.9},
                arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.8})


def _title(what: str, workload: str, concurrency: int | None = None,
           n: int | None = None) -> str:
    parts = [what]
    if workload:
        parts.append(f"workload {workload}")
    if concurrency is not None:
        parts.append(f"concurrency {concurrency}")
    if n is not None:
        parts.append(f"{n} config" + ("" if n == 1 else "s"))
    return " \u2014 ".join(parts[:1]) + ("\n" + ", ".join(parts[1:]) if parts[1:] else "")


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(str(text), width)) or str(text)


def _note(notes: list[str] | None, text: str) -> None:
    if notes is not None:
        notes.append(text)


def policy_frame(doc: PolicyDocument) -> pd.DataFrame:
    """Speedup against concurrency from a policy document: static configs from the ladder
    phase and the policy from its verification runs; the baseline is 1.0 by definition."""
    rows = []
    for cfg in doc.configs:
        for c, st in cfg.stats.items():
            rows.append({"series": cfg.label, "concurrency": c,
                         "speedup": st.speedup, "noise": st.noise})
    for r in doc.verification.rows if doc.verification else ():
        rows.append({"series": "policy (per-batch-size K)", "concurrency": r.concurrency,
                     "speedup": r.policy_speedup, "noise": r.policy_noise})
    for c in doc.ladder:
        rows.append({"series": "baseline (no speculation)", "concurrency": int(c),
                     "speedup": 1.0, "noise": 0.0})
    return pd.DataFrame(rows)


def policy_plot(doc: PolicyDocument, out_dir: Path, *, notes: list[str] | None = None
                ) -> list[Path]:
    """Speedup over the baseline against concurrency for the baseline, the static configs and
    the policy, with a band for the noise and each config's break-even point marked."""
    import seaborn as sns

    df = policy_frame(doc)
    if df.empty:
        _note(notes, "Policy: no ladder measurements yet.")
        return []
    with sns.axes_style("whitegrid"):
        fig = _figure(9.6, 5.0)
        ax = fig.add_subplot()
        series = list(dict.fromkeys(df["series"]))
        palette = dict(zip(series, sns.color_palette("tab10", len(series)), strict=True))
        palette["baseline (no speculation)"] = BASELINE_COLOR
        for name in series:
            part = df[df["series"] == name].sort_values("concurrency")
            style = {"lw": 2.6, "marker": "D"} if name.startswith("policy") else \
                {"lw": 1.4, "marker": "o", "ls": "--" if name.startswith("baseline") else "-"}
            ax.plot(part["concurrency"], part["speedup"], label=_wrap(name, 34),
                    color=palette[name], **style)
            if not name.startswith("baseline"):
                ax.fill_between(part["concurrency"], part["speedup"] * (1 - part["noise"]),
                                part["speedup"] * (1 + part["noise"]), color=palette[name],
                                alpha=0.12, lw=0)
        for cfg in doc.configs:
            be = cfg.break_even
            if be is not None and be.status is BreakEvenStatus.CROSSES and be.concurrency:
                ax.axvline(be.concurrency, color=palette.get(cfg.label, "0.5"), lw=1, ls=":")
                ax.annotate(f"break-even ~{be.concurrency:.1f}", (be.concurrency, 1.0),
                            xytext=(4, 18), textcoords="offset points", fontsize="small",
                            color=palette.get(cfg.label, "0.3"), rotation=90, va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(doc.ladder))
        ax.set_xticklabels([str(c) for c in doc.ladder])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("output throughput speedup over baseline (x)")
        ax.set_title(_title("Where speculation stops paying", str(doc.workload or ""))
                     .strip())
        _legend_outside(ax)
        return [_save(fig, out_dir / "policy_speedup.png")]
