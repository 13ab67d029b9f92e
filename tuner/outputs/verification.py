"""Outputs stage, the out-of-sample check in words: the plan `tuner verify` announces, one line
per launch, the table it prints at the end (a miss said out loud), and verify.json (the
record with those sentences beside it)."""

from __future__ import annotations

from pathlib import Path

from tuner.intervals import percent
from tuner.outputs import files
from tuner.outputs.text import num, times
from tuner.records.configs import RequestSchedule
from tuner.records.verification import (
    CheckOutcome,
    LevelCheck,
    SkipReason,
    Verification,
    VerifyLaunch,
    VerifyTarget,
)

FILE_NAME = "verify.json"

_SKIPS = {
    SkipReason.NO_INTERVAL: "the study stated no speedup interval at this level (it needs a "
                            "baseline and a speculative config launched, with a between-launch "
                            "spread to go on); nothing to check",
    SkipReason.NO_SUBJECT: "the config the study's interval is about is not among its trials; "
                           "nothing to launch",
}
_OUTCOMES = {CheckOutcome.INSIDE: "inside", CheckOutcome.ABOVE: "MISS (above)",
             CheckOutcome.BELOW: "MISS (below)", CheckOutcome.UNMEASURED: "not measured",
             CheckOutcome.SKIPPED: "skipped"}


def plan_line(*, study: str, schedule: RequestSchedule, excluded: int, pool: int,
              launches: int, subjects: int) -> str:
    """What the check sends and launches, said once before the first launch."""
    parts = ", ".join(f"c={lv.concurrency}: {len(lv.warmups)}{' warm-up' if i == 0 else ''} + "
                      f"{len(lv.measured)}" for i, lv in enumerate(schedule.levels))
    return (f"Verifying study '{study}' out of sample: every launch sends {schedule.requests} "
            f"prompts the study never sent ({parts}; {excluded} of the {pool} prompts loaded "
            f"were the study's and are left out); {launches} launch(es) each of the baseline "
            f"and {subjects} config(s), interleaved.")


def shortened_line(schedule: RequestSchedule) -> str | None:
    """Where too few fresh prompts were left for the study's request counts; None otherwise."""
    short = [lv for lv in schedule.levels if lv.asked is not None]
    if not short:
        return None
    per = ", ".join(f"c={lv.concurrency} {len(lv.measured)} of {lv.asked}" for lv in short)
    return (f"Levels shortened: the workload holds too few prompts the study never sent for "
            f"its request counts; measured requests {per}. The check is less sure where a "
            f"level is shorter than the study's.")


def skip_line(target: VerifyTarget) -> str:
    return f"c={target.concurrency}: skipped: {_SKIPS[target.skip]}."


def launch_line(launch: VerifyLaunch, total: int) -> str:
    """One line as a launch ends: its config and each level's throughput, or its failure."""
    head = f"[{launch.number + 1}/{total}] round {launch.round} {launch.label}"
    if launch.failure is not None:
        return (f"{head}: failed ({launch.failure.kind}): {launch.failure.reason}. Recorded; "
                f"the check goes on.")
    levels = " | ".join(f"c={c} {v:.1f} tok/s" for c, v in sorted(launch.throughputs.items()))
    start = (f" | engine start {launch.engine_start_s:.0f} s"
             if launch.engine_start_s is not None else "")
    return f"{head}: {levels}{start}"


def sentence(check: LevelCheck) -> str:
    """The level's result in one sentence."""
    t = check.target
    c = t.concurrency
    if check.outcome == CheckOutcome.SKIPPED:
        return skip_line(t)
    what = f"{t.subject_label} over the baseline"
    if t.status == "speculation_off":
        what += " (the study left speculation off; this is the fastest config it measured)"
    stated = _stated(t)
    if check.outcome == CheckOutcome.UNMEASURED:
        return (f"c={c}: {what}: not measured (no completed launch of "
                f"{'the baseline' if not check.baseline_throughputs else 'the config'}); "
                f"stated {stated}.")
    prompts = f"{check.requests} fresh prompts" if check.requests else "fresh prompts"
    measured = (f"measured {times(check.measured_speedup)} on {prompts} "
                f"({len(check.subject_throughputs)} and {len(check.baseline_throughputs)} "
                f"launches)")
    if check.expected_interval is not None:
        expected = _expected(check)
        if check.outcome == CheckOutcome.INSIDE:
            return f"c={c}: {what}: {measured}, inside {expected}."
        side = "above" if check.outcome == CheckOutcome.ABOVE else "below"
        return (f"c={c}: MISS: {what}: {measured} lies {side} {expected}; the study's "
                f"statement did not hold out of sample.")
    if check.outcome == CheckOutcome.INSIDE:
        return f"c={c}: {what}: {measured}, inside the stated {stated}."
    side = "above" if check.outcome == CheckOutcome.ABOVE else "below"
    return (f"c={c}: MISS: {what}: {measured} lies {side} the stated {stated}; the study's "
            f"interval did not hold out of sample.")


def _expected(check: LevelCheck) -> str:
    lo, hi = check.expected_interval or (float("nan"), float("nan"))
    against = ("inside it" if check.stated_outcome == CheckOutcome.INSIDE
               else f"{'above' if check.stated_outcome == CheckOutcome.ABOVE else 'below'} it")
    return (f"the range expected of {check.requests} fresh prompts, {lo:.2f}-{hi:.2f} (the "
            f"stated {_stated(check.target)} is the workload's mean; these prompts' own "
            f"spread ±{check.fresh_sd or 0.0:.1%} and the check's launches' "
            f"±{check.launch_sd or 0.0:.1%} widen it; the measurement lies {against})")


def _stated(t: VerifyTarget) -> str:
    lo, hi = t.stated_interval or (float("nan"), float("nan"))
    return (f"{times(t.stated_speedup)} ({percent(t.confidence or 0.0)} interval "
            f"{lo:.2f}-{hi:.2f})")


def table(v: Verification) -> str:
    """A row per level, then one sentence per level (a miss said out loud)."""
    head = ["conc", "checked", "stated", "interval", "expected", "measured", "config tok/s",
            "baseline tok/s", "result"]
    rows = []
    for check in v.levels:
        t = check.target
        lo_hi = f"{t.stated_interval[0]:.2f}-{t.stated_interval[1]:.2f}" \
            if t.stated_interval else "-"
        expected = (f"{check.expected_interval[0]:.2f}-{check.expected_interval[1]:.2f}"
                    if check.expected_interval else "-")
        rows.append([str(t.concurrency), t.subject_label or "-", times(t.stated_speedup),
                     lo_hi, expected, times(check.measured_speedup),
                     _with_spread(check.subject_median, check.subject_spread),
                     _with_spread(check.baseline_median, check.baseline_spread),
                     _OUTCOMES[check.outcome]])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    lines = [_line(head, widths), _line(["-" * w for w in widths], widths)]
    lines += [_line(r, widths) for r in rows]
    lines += [sentence(check) for check in v.levels]
    lines.append("tok/s: the median over the launches, \u00b1 their MAD over the median. "
                 "expected: where a measurement on these fresh prompts is expected, the "
                 "stated interval widened by their own spread and the launches' noise.")
    return "\n".join(lines)


def _line(cells: list[str], widths: list[int]) -> str:
    """The first two cells (the level, a label) left-aligned, figures right-aligned."""
    return "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(cells, widths, strict=True))).rstrip()


def _with_spread(median: float | None, spread: float | None) -> str:
    text = num(median)
    return text if spread is None or text == "-" else f"{text} \u00b1{spread:.1%}"


def write(v: Verification, out_dir: Path) -> Path:
    """verify.json: the record, and each level's sentence beside it."""
    doc = {**v.model_dump(mode="json"), "said": [sentence(check) for check in v.levels]}
    return files.write_json(Path(out_dir) / FILE_NAME, doc)
