"""Outputs stage, what every plot shares: a figure on its own Agg canvas, saved atomically as a
PNG; a colour per method, the same in every figure of a report; titles, wrapped labels and a
legend beside the axes; the leading configs a figure shows; and the note a plot leaves where its
data is missing.

Drawing on a private canvas rather than through pyplot leaves nothing global to close or leak,
and a notebook's backend alone.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from tuner.records.recommendations import Recommendation

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Fixed colours per method, so one method looks the same in every figure of a report.
_METHOD_ORDER = ("ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp", "ngram_gpu",
                 "medusa", "mlp_speculator")
BASELINE_COLOR = "#3b3b3b"
# A colour as matplotlib takes it: an RGB triple (seaborn's palettes) or a colour string.
Color = tuple[float, float, float] | str
DPI = 130


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


def figure(width_in: float, height_in: float) -> Figure:
    """A figure of that size in inches, on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> Path:
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


def legend_outside(ax: Any, *, title: str | None = None) -> None:
    """Legend to the right of the axes, so it never covers a point."""
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    if handles:
        ax.legend(handles, labels, title=title, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  borderaxespad=0.0, frameon=False, fontsize="small", title_fontsize="small")


def title(what: str, workload: str, concurrency: int | None = None,
          n: int | None = None) -> str:
    """`what` on the first line; the workload, level and config count under it."""
    parts = [what]
    if workload:
        parts.append(f"workload {workload}")
    if concurrency is not None:
        parts.append(f"concurrency {concurrency}")
    if n is not None:
        parts.append(f"{n} config" + ("" if n == 1 else "s"))
    return " \u2014 ".join(parts[:1]) + ("\n" + ", ".join(parts[1:]) if parts[1:] else "")


def wrap(text: str, width: int) -> str:
    """`text` broken into lines of at most `width` characters."""
    return "\n".join(textwrap.wrap(str(text), width)) or str(text)


def note(notes: list[str] | None, text: str) -> None:
    """Say why a plot was left out, where the caller collects notes."""
    if notes is not None:
        notes.append(text)


def leading_configs(spec: pd.DataFrame, *, top_n: int,
                    recommendations: Sequence[Recommendation]) -> list[str]:
    """The leading configs' keys, at most `top_n` unless more are recommended: the
    recommended ones first, then by best speedup over any level."""
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
