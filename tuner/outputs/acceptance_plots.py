"""Outputs stage, the acceptance plots: mean acceptance length against the draft length K by
method, and the acceptance rate at each draft position for the leading configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from tuner.analysis.pareto import Points
from tuner.outputs import figures
from tuner.records.recommendations import Recommendation


def acceptance_plot(
    points: Points, out_dir: Path, *, workload: str = "", notes: list[str] | None = None,
) -> list[Path]:
    """Mean acceptance length against num_speculative_tokens, by method."""
    import seaborn as sns

    data = points.measured
    data = data[(data["method"] != "none") & data["num_speculative_tokens"].notna()
                & data["spec_decode_acceptance_length"].notna()]
    if data.empty:
        figures.note(notes, "Acceptance length vs k: no completed speculative trial reported "
                            "acceptance (num_speculative_tokens and vLLM's spec-decode "
                            "counters).")
        return []
    data = data.assign(k=pd.to_numeric(data["num_speculative_tokens"]),
                       level=data["concurrency"].map(lambda c: f"c={int(c)}"))
    ks = sorted(data["k"].unique())
    with sns.axes_style("whitegrid"):
        fig = figures.figure(8.6, 4.8)
        ax = fig.add_subplot()
        ax.plot([0, max(ks)], [1, max(ks) + 1], color="0.6", ls=":", lw=1.2,
                label="upper bound (k + 1)")
        palette = figures.method_palette(data["method"])
        sns.lineplot(data=data, x="k", y="spec_decode_acceptance_length", hue="method",
                     palette=palette, errorbar=None, lw=1.2, alpha=0.6, ax=ax, legend=False)
        sns.scatterplot(data=data, x="k", y="spec_decode_acceptance_length", hue="method",
                        palette=palette, style="level", s=60, ax=ax, zorder=3)
        ax.set_xlim(0.5, max(ks) + 0.5)
        ax.set_ylim(1.0, max(data["spec_decode_acceptance_length"].max() * 1.15, 2.0))
        ax.set_xticks(ks if len(ks) <= 16 else ks[:: max(1, len(ks) // 12)])
        ax.set_xlabel("num_speculative_tokens k (draft tokens per step)")
        ax.set_ylabel("mean acceptance length (tokens/step)")
        ax.set_title(figures.title("Acceptance length vs draft length", workload))
        figures.legend_outside(ax)
        return [figures.save(fig, Path(out_dir) / "acceptance_length.png")]


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
        figures.note(notes, "Per-position acceptance: no completed trial reported "
                            "per-position acceptance counts.")
        return []
    ranked = spec.assign(speedup_throughput=spec["speedup_throughput"].fillna(0))
    leaders = figures.leading_configs(ranked, top_n=top_n, recommendations=recommendations)
    rows = []
    for _, r in spec[spec["config_key"].isin(leaders)].drop_duplicates(
            ["config_key", "concurrency"]).iterrows():
        for pos, rate in enumerate(r[col], start=1):
            rows.append({"config": figures.wrap(r["label"], 30), "key": r["config_key"],
                         "concurrency": int(r["concurrency"]), "position": pos,
                         "rate_pct": 100.0 * float(rate)})
    long = pd.DataFrame(rows)
    order = [long.loc[long["key"] == k, "config"].iloc[0] for k in leaders
             if (long["key"] == k).any()]
    levels = sorted(long["concurrency"].unique())[:4]
    with sns.axes_style("whitegrid"):
        fig = figures.figure(max(4.6 * len(levels), 7.0), 5.4)
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
        fig.suptitle(figures.title("Per-position acceptance of the leading configs", workload))
        # Below the panels, not beside them: the figure stays narrow enough to read in a page.
        handles, labels = axes[-1].get_legend_handles_labels()
        if axes[-1].get_legend() is not None:
            axes[-1].get_legend().remove()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 2),
                   frameon=False, fontsize="small")
        return [figures.save(fig, Path(out_dir) / "acceptance_per_position.png")]
