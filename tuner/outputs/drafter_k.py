"""Outputs stage, a model-based drafter's K axis in words (tuner.records.drafter_k): per
drafter, where the rates come from and whether its cost is calibrated, a table per level of
every K (acceptance with its standard error, the step, throughput; measured and the errors
where a launch at that K checks it) and a line for every miss beyond the stated accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.outputs.text import num, signed_pct, table_line
from tuner.records.drafter_k import DrafterAxis, KPoint

_HEAD = ["K", "acc len (SE)", "meas", "err (allowed)", "step ms", "pred tok/s", "meas tok/s",
         "err", "speedup"]


def axes_text(axes: Sequence[DrafterAxis]) -> str:
    """Every drafter's K axis, blocks separated by a blank line ("" for none)."""
    return "\n\n".join(axis_text(ax) for ax in axes)


def axis_text(ax: DrafterAxis) -> str:
    """One drafter's K axis: its heading, a table per level, then its misses."""
    blocks = [heading(ax)]
    for c in sorted({p.concurrency for p in ax.points}):
        rows = [_cells(p) for p in ax.points if p.concurrency == c]
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(_HEAD)]
        blocks.append("\n".join([f"  c={c}", table_line(_HEAD, widths),
                                 table_line(["-" * w for w in widths], widths),
                                 *(table_line(r, widths) for r in rows)]))
    notes = []
    if any(p.fitted and not p.source for p in ax.points):
        notes.append("  * the step cost was fitted on this launch: its throughput error is "
                     "in-sample (its acceptance is still predicted from the source launch).")
    notes += ["  " + line for line in miss_lines(ax)]
    return "\n".join([*blocks, *notes])


def heading(ax: DrafterAxis) -> str:
    costs = ", ".join(
        f"c={c.concurrency}: step = {c.base_step_ms:.1f} {c.fixed_ms:+.2f} + "
        f"{c.per_token_ms:.2f} x K ms" + (
            f" (verify {c.verify_ms_per_token:.2f}, drafter {c.drafter_ms_per_token:.2f} per K)"
            if c.verify_ms_per_token is not None else "") for c in ax.costs)
    if ax.calibrated:
        how = ("calibrated on launches at K=" + ",".join(
            map(str, sorted({k for c in ax.costs for k in c.fitted_on_k}))))
    else:
        how = ("not calibrated where one K was launched: the drafter's fixed cost per step is "
               "taken as 0 there (a launch at a small K calibrates it)")
    launched = ",".join(map(str, ax.launched_k)) or str(ax.source_k)
    return (f"{ax.label}: every K 1-{ax.source_k} at every level from trial {ax.source_trial}'s "
            f"per-position acceptance at K={ax.source_k} (launched: K={launched}). Step cost "
            f"{how}; {costs or 'no level priced (no baseline there)'}.")


def miss_lines(ax: DrafterAxis) -> list[str]:
    """One line per K and level whose launch measured beyond the stated accuracy."""
    out = []
    for p in ax.misses():
        what = []
        if p.acceptance_miss:
            what.append(f"acceptance length {p.acceptance_length:.2f} predicted, "
                        f"{p.meas_acceptance_length:.2f} measured "
                        f"({signed_pct(p.err_acceptance_length_pct)}, stated accuracy "
                        f"\u00b1{p.acceptance_accuracy_pct:.1f}%)")
        if p.throughput_miss:
            what.append(f"throughput {p.output_throughput:.1f} tok/s predicted, "
                        f"{p.meas_output_throughput:.1f} measured "
                        f"({signed_pct(p.err_output_throughput_pct)}, stated accuracy "
                        f"\u00b1{p.throughput_accuracy_pct:.0f}%)")
        out.append(f"MISS {ax.label} K={p.k} c={p.concurrency}: " + "; ".join(what)
                   + ". The launch's measurement stands; the prediction from "
                   f"K={ax.source_k} does not hold there.")
    return out


def _cells(p: KPoint) -> list[str]:
    measured = p.measured_trials > 0
    mark = " *" if p.fitted and not p.source else (" (source)" if p.source else "")
    return [f"{p.k}{mark}", f"{p.acceptance_length:.2f} ({p.acceptance_length_se:.2f})",
            num(p.meas_acceptance_length, "{:.2f}") if measured else "",
            (f"{signed_pct(p.err_acceptance_length_pct)} (\u00b1{p.acceptance_accuracy_pct:.1f}%)"
             + (" MISS" if p.acceptance_miss else "")) if measured and not p.source else "",
            num(p.step_ms), num(p.output_throughput),
            num(p.meas_output_throughput) if measured else "",
            (signed_pct(p.err_output_throughput_pct) + (" MISS" if p.throughput_miss else ""))
            if measured and not p.source else "",
            num(p.speedup, "{:.2f}x")]

