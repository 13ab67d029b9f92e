"""Outputs, the search's events in words (tuner.records.decisions): `lines` gives the progress
lines a person reads as the study runs (what everyone sees, and what -v adds), `text` the
sentence the report's "How it was decided" shows for a decision. The search records figures;
every sentence about them is written here.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from tuner.outputs import selection as selection_words
from tuner.records import decisions as ev


class Level(str, Enum):
    """Who sees a progress line: everyone (`SAY`), or -v only (`DETAIL`)."""

    SAY = "say"
    DETAIL = "detail"


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _stop_text(e: ev.BudgetSpent) -> str:
    if e.limit == "timeout":
        return f"--timeout {e.timeout_s or 0:.0f} s reached; stopping" + (
            "." if e.launches else " the search.")
    if e.launches:
        return f"--n-trials {e.n_trials}: every engine launch of the budget is spent."
    return f"--n-trials {e.n_trials}: every trial of the budget is spent."


def _path_gap(e: ev.PathGap) -> str:
    return (f"the aligned baseline (trial {e.aligned_trial}) still differs from trial "
            f"{e.trial}'s path ({e.difference}); its split into path cost and speculation "
            "gain is approximate.")


def _path_left(e: ev.PathLeft) -> str:
    return (f"Trial {e.trial} ({e.label}) left the plain baseline's path ({e.difference}); "
            f"measuring an aligned baseline once (no speculation, {' '.join(e.knobs)}) "
            "beside the plain one, to split path cost from speculation gain.")


def _path_same(e: ev.PathSame) -> str:
    return (f"Trial {e.trial} ({e.label}) ran the plain baseline's path, or one its log does "
            "not tell apart; no aligned baseline to measure.")


def step_cost_text(e: ev.StepCostFit) -> str:
    """ "c=1: step = 9.00 ms + 1.000 ms x tokens scored; first token: ...; fitted on ..." """
    pts = ", ".join(f"{p.label} (n={p.scored:.1f}"
                    + (f", u={p.mixed:.2f}" if e.mixed_term else "")
                    + f", {p.step_ms:.1f} ms)" for p in e.points)
    mixed = ""
    if e.mixed_fitted:
        mixed = f" + {e.m_ms:.2f} ms x non-uniform share"
    elif e.mixed_term:
        mixed = " (non-uniform steps not priced yet: no point spans them)"
    if e.profile:
        mixed += "; speculative steps add the step shape " + ", ".join(
            f"n={n} {t:.1f} ms [{k}]" for n, t, k in e.profile)
    first = (f"; first token: {e.prefill_ms_per_token:.3f} ms per prompt token + "
             f"{e.prefill_overhead_ms:.1f} ms")
    return (f"c={e.concurrency}: step = {e.a_ms:.2f} ms + {e.b_ms:.3f} ms x tokens "
            f"scored{mixed}{first}; fitted on {pts}; {e.path}")


def _leaders(e: ev.Leaders) -> str:
    def pm(r: ev.Leader) -> str:
        x = r.output_throughput_pm
        return f" \u00b1{x:.1f}" if x is not None and x == x else ""
    return "; ".join(f"{r.label} {r.output_throughput:.1f}{pm(r)} tok/s ({r.speedup:.2f}x)"
                     for r in e.leaders)


def _forecast_miss(e: ev.ForecastMissed) -> str:
    c = e.check
    return (f"Forecast missed at c={c.concurrency}: {c.label} measured {c.measured:.1f} tok/s "
            f"where the step-cost model predicted {c.predicted:.1f} on the same requests "
            f"({c.error_pct:+.1f}%, beyond its stated ±{c.accuracy_pct:.1f}%).")


def _mixed(e: ev.MixedCalibration) -> str:
    return (f"{e.label} drafts a full K on {e.uniform_share:.0%} of its steps at "
            f"c={e.concurrency}: this engine splits CUDA graphs by batch shape, so the step "
            "cost needs a point where most steps are not uniform.")


def _calibration(e: ev.Calibration) -> str:
    return (f"{e.label} drafts the most per step ({e.drafted_per_step:.1f} tokens), so the "
            "step-cost line spans the space.")


def _expected_time(e: ev.ExpectedTime) -> str:
    return (f"Each launch sends the same {e.requests} requests; the baseline's took "
            f"{e.baseline_s:.0f} s, so the {e.launches_left} launch(es) left take about "
            f"{e.launches_left * e.baseline_s / 60:.1f} min (speculative ones as much faster "
            "or slower as they decode).")


def _launch_failed(e: ev.LaunchFailed) -> str:
    if e.leader:
        return f"{e.label} failed; it leaves the confirmation."
    return f"{e.label} failed to re-measure; stopping the confirmation."


_NO_TOKENS = ("The baseline trial holds no token ids (this vLLM did not return them), so "
              "replay cannot predict; using the Optuna search instead.")
_NO_LEADER = "No predicted leader to confirm."
_REPEATING = ("The sampler keeps proposing configs already measured or refused: the space "
              "looks exhausted; stopping the search.")


def _exhausted(e: ev.SpaceExhausted) -> str:
    return (f"Every config of search space '{e.space}' ({e.configs}) is measured or refused; "
            "stopping the search.")


def _tied(e: ev.TiedLeaders) -> str:
    return (f"At temperature {e.temperature:g}, {e.tied} configs' 90% throughput intervals "
            f"overlap the best's ({e.best}): the replay cannot order them, the confirm "
            f"launches decide (launched among them: {', '.join(e.launched) or 'none'}; "
            "--confirm-leaders launches more).")


_TEXT: dict[type, Callable[..., str]] = {
    ev.Note: lambda e: e.text,
    ev.NoTokens: lambda e: _NO_TOKENS,
    ev.ExpectedTime: _expected_time,
    ev.SpaceReplayed: lambda e: (
        f"Replayed {e.configs} configs of space '{e.space}' over the baseline's "
        f"{e.requests_per_level} requests per level in {e.seconds:.1f} s (no engine)."),
    ev.Calibration: _calibration,
    ev.MixedCalibration: lambda e: f"Then {_mixed(e)}",
    ev.Climb: lambda e: (
        f"Searched the sampled grids around the predicted leaders: {e.added} more configs "
        f"replayed ({e.configs} in all, {e.seconds:.1f} s)."),
    ev.PathSame: _path_same,
    ev.PathLeft: _path_left,
    ev.PathGap: lambda e: _upper(_path_gap(e)),
    ev.StepCostFit: step_cost_text,
    ev.TokenStreams: lambda e: e.line,
    ev.SamplingMismatch: lambda e: e.line,
    ev.PredictionMissed: lambda e: e.miss.text(),
    ev.NoLeader: lambda e: _NO_LEADER,
    ev.Leaders: lambda e: f"At c={e.concurrency}, launched to confirm them: {_leaders(e)}.",
    ev.TiedLeaders: _tied,
    ev.LaunchFailed: _launch_failed,
    ev.LevelSelected: lambda e: (f"{selection_words.headline(e.selection)}; "
                                 f"{selection_words.reason(e.selection)}"),
    ev.ForecastMissed: _forecast_miss,
    ev.BudgetSpent: _stop_text,
    ev.SpaceExhausted: _exhausted,
    ev.SamplerRepeating: lambda e: _REPEATING,
}


def text(e: ev.Event) -> str:
    """The sentence the report's "How it was decided" shows for a decision."""
    words = _TEXT.get(type(e))
    if words is None:
        raise ValueError(f"no words for a {type(e).__name__} event")
    return words(e)


_SAY, _DETAIL = Level.SAY, Level.DETAIL
# The progress lines of each kind (a decision not named here: its text, said to everyone).
_LINES: dict[type, Callable[..., list[tuple[Level, str]]]] = {
    ev.Note: lambda e: [],
    ev.SpaceReplayed: lambda e: [(_DETAIL, text(e))],
    ev.Climb: lambda e: [(_DETAIL, text(e))],
    ev.PathSame: lambda e: [(_DETAIL, f"Engine path: {text(e)}")],
    ev.ReplayStarted: lambda e: [(_SAY, f"Replaying {e.configs} configs of space '{e.space}' "
                                        "over the baseline's tokens (no engine) ...")],
    ev.Calibration: lambda e: [(_SAY, f"Calibration launch: {text(e)}")],
    ev.MixedCalibration: lambda e: [
        (_SAY, f"Second calibration launch: {e.label} (this engine splits CUDA graphs by "
               "batch shape)."),
        (_DETAIL, f"Second calibration launch: {_mixed(e)}")],
    ev.PathLeft: lambda e: [
        (_SAY, f"Aligned baseline: trial {e.trial} ({e.label}) left the plain baseline's "
               "engine path; measuring a baseline on that path once."),
        (_DETAIL, f"Engine path: {text(e)}")],
    ev.PathGap: lambda e: [(_SAY, f"Engine path: {_path_gap(e)}")],
    ev.StepCostFit: lambda e: [(_DETAIL, f"  step cost {step_cost_text(e)}")],
    ev.TokenStreams: lambda e: [(_DETAIL, f"  {e.line}")],
    ev.Leaders: lambda e: [(_SAY, f"Predicted leaders at c={e.concurrency}: {_leaders(e)}")],
    ev.TiedLeaders: lambda e: [(_DETAIL, text(e))],
    ev.LevelSelected: lambda e: [
        (_SAY, "Forecast " + _lower(selection_words.headline(e.selection))),
        (_DETAIL, f"  {selection_words.reason(e.selection)}")],
    ev.TrialFailedEvent: lambda e: [
        (_SAY, f"[{e.done}/{e.total}] trial {e.trial} {e.label}: FAIL ({e.failure_kind}) "
               f"{e.reason[:300]} -- recorded; the study continues ({e.wall_s:.0f} s). "
               f"Log: {e.log}")],
    ev.RefusedBefore: lambda e: [
        (_SAY, f"trial {e.trial} {e.label}: the engine refused this config in trial "
               f"{e.refused_trial} ({e.failure_kind}); answered from storage as FAIL (no "
               "engine launched; a new --study-name would launch it again)")],
    ev.SameConfig: lambda e: [
        (_SAY, f"trial {e.trial} {e.label}: same config as trial {e.duplicate_of}, answered "
               "from storage (no engine launched)")],
    ev.TokensUnreadable: lambda e: [
        (_SAY, f"trial {e.trial}: its token capture came back unreadable; stored without "
               "it, so replay is unavailable for this trial")],
    ev.EngineStarting: lambda e: [
        (_DETAIL, f"  trial {e.trial}: engine starting for {e.label} (log: {e.log}); its "
                  "figures come back when it ends")],
    ev.RepeatOf: lambda e: [(_SAY, f"repeat of trial {e.trial} ({e.label})")],
}


def lines(e: ev.Event, *, trial_line: Callable[..., str] | None = None
          ) -> list[tuple[Level, str]]:
    """The progress lines `e` prints as the study runs, each with who sees it.
    `trial_line(result, baseline)`: a finished trial's figures (tuner.outputs.console)."""
    if isinstance(e, ev.TrialEnded):
        figures = (trial_line or _label_line)(e.result, e.baseline)
        return [(_SAY, f"[{e.done}/{e.total}] trial {e.trial} {figures} ({e.wall_s:.0f} s)")]
    shown = _LINES.get(type(e))
    return shown(e) if shown is not None else [(_SAY, text(e))]


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]


def _label_line(result, _baseline) -> str:
    return result.label()


def no_answer_text(found: ev.NoAnswer) -> str:
    """One line for a study with nothing to compare: what failed most, one reason, its log
    (last, so the path can be copied without punctuation stuck to it), and what to do."""
    if found.kind is not None:
        reason = " ".join(found.reason.split())
        reason = reason if len(reason) <= 300 else reason[:297] + "..."
        why = f"most common: {found.kind} x{found.count}: {reason.rstrip('.')}"
        fix = (f"Fix the cause and rerun the same command (finished trials are kept). Logs: "
               f"{found.log}")
    else:
        why, fix = "the baseline has not run yet", "Rerun the same command to resume."
    if not found.completed:
        if not found.failed:
            return f"No trial of study '{found.study_name}' has finished. {fix}"
        return f"All {found.failed} trials failed; {why}. {fix}"
    return (f"The baseline (no speculation) did not complete, so no speedup can be measured "
            f"though {found.completed} speculative trial(s) did; {why}. {fix}")


def unreplayable_text(u: ev.Unreplayable) -> str:
    """Why the replay strategy cannot predict a space, as a clause."""
    if u.why == "methods":
        return (f"method(s) {', '.join(u.methods)} cannot be replayed (only "
                f"{', '.join(u.replayable)} can)")
    if u.why == "engine_knobs":
        return "the space searches engine knobs, which the step-cost model does not cover"
    return "--acceptance-profile forces a synthetic acceptance that replay cannot predict"
