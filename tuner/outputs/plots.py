"""Outputs stage, plots: the report's figures, seaborn figures drawn from what the analysis
computed, saved as PNG files.

draw_all draws every figure of a study's points (tuner.analysis.pareto.Points: the measured
points with their speedups, split and fronts; never raw storage, and nothing recomputed here):
the Pareto plots (tuner.outputs.pareto_plot), the speedup plot (tuner.outputs.speedup_plot) and
the acceptance plots (tuner.outputs.acceptance_plots); policy_plot draws a policy document's
speedup against concurrency. Every figure has units on its axes, is drawn on its own Agg canvas
and written atomically (tuner.outputs.figures). A plot whose data is missing writes nothing,
returns [] and appends a note saying why to `notes`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from tuner.analysis.pareto import Points
from tuner.outputs import figures
from tuner.outputs.acceptance_plots import acceptance_plot, per_position_plot
from tuner.outputs.pareto_plot import pareto_plots
from tuner.outputs.speedup_plot import speedup_plot
from tuner.records.policy import BreakEvenStatus, PolicyDocument
from tuner.records.recommendations import Recommendation


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
        figures.note(notes, "Policy: no ladder measurements yet.")
        return []
    with sns.axes_style("whitegrid"):
        fig = figures.figure(9.6, 5.0)
        ax = fig.add_subplot()
        series = list(dict.fromkeys(df["series"]))
        palette = dict(zip(series, sns.color_palette("tab10", len(series)), strict=True))
        palette["baseline (no speculation)"] = figures.BASELINE_COLOR
        for name in series:
            part = df[df["series"] == name].sort_values("concurrency")
            style = {"lw": 2.6, "marker": "D"} if name.startswith("policy") else \
                {"lw": 1.4, "marker": "o", "ls": "--" if name.startswith("baseline") else "-"}
            ax.plot(part["concurrency"], part["speedup"], label=figures.wrap(name, 34),
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
        ax.set_title(figures.title("Where speculation stops paying", str(doc.workload or ""))
                     .strip())
        figures.legend_outside(ax)
        return [figures.save(fig, out_dir / "policy_speedup.png")]
