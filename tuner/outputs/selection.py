"""Outputs, the selection in words: each level's Selection (tuner.records.selection) as the
line the study prints while it decides, and as the answer's reason and confidence. The words
follow the figures by one rule (tuner.replay.selection.choice): "Turn on" only where the
interval lies above 1.00x, "leave speculation off" only where it lies below 1 + the zone,
"undecided" first wherever neither holds, and "decided" only where one of those holds."""

from __future__ import annotations

from collections.abc import Callable

from tuner import intervals
from tuner.records.decisions import ForecastMissed, LevelSelected
from tuner.records.selection import Choice, RestsOn, Selection, Undecided


def interval_text(s: Selection) -> str:
    """ "2.41x (95% interval 2.30-2.52)"; "1.63x (no interval yet)" """
    point = "?" if s.speedup is None else f"{s.speedup:.2f}x"
    if s.lo is None or s.hi is None:
        return f"{point} (no interval yet)"
    return f"{point} ({intervals.percent(s.confidence)} interval {s.lo:.2f}-{s.hi:.2f})"


def basis_text(s: Selection) -> str:
    """What the figures rest on, in one clause."""
    if s.rests_on == RestsOn.MEASURED:
        miss = next((c for c in s.checks if c.label == s.subject and c.missed), None)
        why = (f"its launch measured {miss.measured:.1f} tok/s where the forecast said "
               f"{miss.predicted:.1f} ({miss.error_pct:+.1f}%, beyond its stated "
               f"±{miss.accuracy_pct:.1f}%)") if miss else "its launch missed the forecast"
        return f"on the launches alone: {why}"
    host = s.host
    noise = (f"host spread {s.host.sd:.1%} ({host.source}, {host.df} df)" if host else "")
    if s.rests_on == RestsOn.SCALED and s.scale is not None and s.scale_launches and host:
        mine, base = s.scale_launches
        return (f"forecast over {s.sample_prompts} workload prompts the study never measured "
                f"(their spread ±{s.sample_sd:.1%}), its step cost scaled by "
                f"{s.scale - 1.0:+.1%} to its own launch(es) on the paired requests "
                f"({mine} of it, {base} of the baseline; their noise ±{s.cost_sd:.1%} from "
                f"the host's spread, {host.sd:.1%} on {host.df} df, {host.source})")
    return (f"forecast over {s.sample_prompts} workload prompts the study never measured "
            f"(their spread ±{s.sample_sd:.1%}), step-cost error ±{s.cost_sd:.1%} from "
            f"{s.residuals} out-of-fit launch(es) and the {noise}")


EQUIVALENT_SHOWN = 4  # labels of the equivalent set a sentence names (the record keeps all)


def equivalent_text(s: Selection) -> str:
    if not s.equivalent_total:
        return ""
    shown = s.equivalent[:EQUIVALENT_SHOWN]
    more = s.equivalent_total - len(shown)
    names = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    return (f"{s.equivalent_total} other config(s) within {intervals.percent(s.indifference)} "
            f"of it are the same choice: {names}")


def decides_text(s: Selection) -> str:
    """What would decide an undecided level."""
    if s.undecided == Undecided.UNLAUNCHED:
        return (f"{s.subject} is not launched yet to confirm the forecast (the study launches "
                f"it next; where --n-trials is spent, a larger one does)")
    if s.undecided == Undecided.SAMPLE:
        return ("the workload prompts differ too much for the sample's size: a larger "
                "--sample-prompts (or --dataset-path with more prompts) decides")
    if s.rests_on == RestsOn.MEASURED and s.launches_to_decide is None:
        return ("more launches of it and the baseline narrow the launches' interval "
                "(a larger --n-trials, or tuner verify on fresh prompts)")
    if s.launches_to_decide is not None:
        return (f"about {s.launches_to_decide} more launch(es) of it and the baseline "
                f"(--n-trials) decide")
    return (f"its gain lies within the step-cost model's error of the "
            f"{intervals.percent(s.indifference)} that counts; no number of launches decides")


def headline(s: Selection) -> str:
    """The level's answer in one line."""
    at = f"Concurrency {s.concurrency}"
    if s.choice == Choice.ON:
        return f"{at}: Turn on {s.subject}: {interval_text(s)} over the baseline"
    if s.choice == Choice.OFF:
        return (f"{at}: Leave speculation off: the best config, {s.subject}, gains "
                f"{interval_text(s)}, under the {intervals.percent(s.indifference)} that counts")
    return f"{at}: Undecided: {s.subject} gains {interval_text(s)}; {decides_text(s)}"


def reason(s: Selection) -> str:
    """The answer's reason: the headline's figures, what they rest on, the equivalent set and
    the launch that confirmed the subject."""
    parts = [basis_text(s)]
    if (eq := equivalent_text(s)):
        parts.append(eq)
    if s.measured_speedup is not None:
        parts.append(f"its launches measured {s.measured_speedup:.2f}x on the paired requests")
    parts += [f"a launch of {c.label} missed the forecast at c={c.concurrency}: "
              f"{c.measured:.1f} tok/s measured, {c.predicted:.1f} predicted "
              f"({c.error_pct:+.1f}%, beyond ±{c.accuracy_pct:.1f}%)"
              for c in s.checks if c.missed and c.label != s.subject]
    return "; ".join(parts) + "."


def answer_text(s: Selection) -> str:
    """The answer's reason in sentences: the subject's figures, then what they rest on."""
    said = {Choice.ON: f"{s.subject} gains {interval_text(s)} over the baseline",
            Choice.OFF: f"nothing beats the baseline by {intervals.percent(s.indifference)}: "
                        f"the best config, {s.subject}, gains {interval_text(s)}",
            Choice.UNDECIDED: f"undecided: {s.subject} gains {interval_text(s)}, which holds "
                              f"both 1.00x and a {intervals.percent(s.indifference)} gain; "
                              f"{decides_text(s)}"}[s.choice]
    return f"{said[0].upper()}{said[1:]}; {reason(s)}"


def confidence(s: Selection) -> str:
    """ "decided at 95%" where the rule decided, else "undecided". """
    if s.choice == Choice.UNDECIDED:
        return "undecided"
    return f"decided at {intervals.percent(s.confidence)}"


def watcher(tell: Callable[..., None]) -> Callable[[tuple[Selection, ...]], None]:
    """What the study records as its selections change (tuner.records.decisions events,
    `tell` as tuner.outputs.decisions Narrator takes them): each level's selection once per
    change (its headline said, and with -v what it rests on), a forecast miss always."""
    shown: dict[int, str] = {}
    missed: set[tuple[str, int]] = set()

    def show(selections: tuple[Selection, ...]) -> None:
        for s in selections:
            for c in s.checks:
                if c.missed and (c.label, c.concurrency) not in missed:
                    missed.add((c.label, c.concurrency))
                    tell(ForecastMissed(check=c))
            line = headline(s)
            if shown.get(s.concurrency) != line:
                shown[s.concurrency] = line
                tell(LevelSelected(selection=s))

    return show
