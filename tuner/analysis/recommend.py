"""Analysis stage, the recommendation: per concurrency level, the config to run, "leave
speculation off", or a refusal when the data cannot support a choice; each carries its
Verdict (the basis it rests on and the figures: repeats, spread, interval), which
tuner.outputs.verdicts turns into words, and the serve and verify commands (the model
named as the user gave it, the serve flags also as a `vllm serve --config` mapping, and a note
where the command names other weights than those measured; tuner.analysis.level_context
builds them), held against the noise of tuner.analysis.noise. Where the
study measured an aligned baseline, the speedup over the plain baseline is split into the
engine path's cost and speculation's own gain (tuner.analysis.decomposition), in the record
and its reason. The speedup carries its interval across launches (tuner.intervals, at the
study's --confidence): where the interval is settled (above 1.00x, below, or within --margin)
it decides whether a gain counts; where it is open, the gain must pass the noise floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import pandas as pd

from tuner import intervals
from tuner.analysis import decomposition, frame, noise, pareto
from tuner.analysis.level_context import LevelContext
from tuner.records.configs import TrialConfig
from tuner.records.recommendations import (
    Basis,
    Recommendation,
    SpeedupInterval,
    ThroughputSpread,
    Verdict,
)
from tuner.records.selection import Choice, Selection
from tuner.records.storage import StudySettings
from tuner.records.trials import Role

# A recommendation needs a choice: at least this many distinct speculative configs measured.
MIN_CANDIDATES = 2


def recommend(
    df: pd.DataFrame, *, concurrency: int, max_tpot_ms: float | None = None,
    max_ttft_ms: float | None = None, settings: StudySettings | None = None,
) -> Recommendation:
    """The config to run at `concurrency`, "leave speculation off", or a refusal with reasons.

    With SLOs (mean TPOT, p99 TTFT: the metrics the search constrains the sampler on) the
    winner is the highest-throughput point of the front among configs meeting them; without,
    the knee of the front. `settings` are the study's (model, workload and request counts for
    the commands, the decision rule, what the replay found); None: unknown, the commands
    name placeholders. Each refusal is a function of its own below.
    """
    at = LevelContext(concurrency, {"max_tpot_ms": max_tpot_ms, "max_ttft_ms": max_ttft_ms},
                settings, configs=frame.configs_of(df))
    rows = df[(df["concurrency"] == concurrency).fillna(False)]
    level = decomposition.decompose(pareto.speedups(frame.with_medians(
        rows[rows["state"] == "COMPLETE"]))).reset_index(drop=True)
    base_rows = level[frame.is_baseline(level)].sort_values("trial")
    if base_rows.empty:
        return _no_baseline(df, at)
    base = base_rows.iloc[0]
    runs = frame.launch_throughputs(df, concurrency)
    at = replace(at, single_run_spread=noise.single_run_spread(level), runs=runs,
                 pool=intervals.Pool.of(runs.values()), base_key=str(base["config_key"]),
                 windows=frame.launch_windows(df, concurrency))
    candidates = level[level["method"] != "none"]
    if candidates["config_key"].nunique() < MIN_CANDIDATES:
        return _too_few_configs(candidates, base, at)
    feasible = level
    if max_tpot_ms is not None:
        feasible = feasible[feasible["mean_tpot_ms"] <= max_tpot_ms]
    if max_ttft_ms is not None:
        feasible = feasible[feasible["p99_ttft_ms"] <= max_ttft_ms]
    front = pareto.pareto_front(feasible)
    if front.empty:
        return _nothing_meets_the_slos(level, base, at)
    base_feasible = base.name in feasible.index
    # Only a measurable gain is a finding (_finding): where the baseline meets the SLOs, a
    # config is a candidate only if it raises throughput over it beyond the noise. Where the
    # baseline misses them, every config meeting them is a finding.
    speculative = front[front["method"] != "none"]
    measurable = speculative.loc[[not base_feasible or _finding(row, base, at)
                                  for _, row in speculative.iterrows()]]
    if measurable.empty:
        fastest = front.sort_values(["output_throughput", "mean_tpot_ms", "trial"],
                                    ascending=[False, True, True]).iloc[0]
        if fastest["method"] == "none" or _gain(fastest) <= 0:
            return _speculation_off(candidates, base, at)
        return _no_measurable_difference(fastest, base, at)
    if max_tpot_ms is None and max_ttft_ms is None:
        win_idx, chosen_by = pareto.knee(measurable), "knee"
    else:
        win_idx = measurable.sort_values(["output_throughput", "mean_tpot_ms", "trial"],
                                         ascending=[False, True, True]).index[0]
        chosen_by = "slos"
    return _turn_on(level.loc[win_idx], base, at, chosen_by=chosen_by,
                    base_feasible=base_feasible)


def _gain(row: pd.Series) -> float:
    """The row's throughput gain over the plain baseline, as a fraction (+0.05: 5% more)."""
    return float(row["speedup_throughput"]) - 1.0


def _beyond_floor(row: pd.Series, base: pd.Series, at: LevelContext) -> bool:
    """Whether the row's gain exceeds the noise floor (noise_floor of the MADs)."""
    return _gain(row) > _spread(row, base, at).noise_floor


def _finding(row: pd.Series, base: pd.Series, at: LevelContext) -> bool:
    """Whether the row's gain over the baseline counts: where its speedup interval is
    settled, the interval decides (above 1.00x counts; below, or within --margin, does
    not); where it is open or there is none, the gain must pass the noise floor."""
    decision = at.decision(row)
    if decision is not None and decision != intervals.OPEN:
        return decision == intervals.ABOVE
    iv = at.interval(row)
    if iv is not None and iv.lo <= 1.0:  # an interval that holds 1.00x is no finding
        return False
    return _beyond_floor(row, base, at)


def _interval(row: pd.Series, at: LevelContext) -> SpeedupInterval | None:
    """The row's speedup over the plain baseline across launches, as the verdict holds it."""
    iv = at.interval(row)
    if iv is None:
        return None
    return SpeedupInterval(point=iv.point, lo=iv.lo, hi=iv.hi, confidence=iv.confidence,
                           launches=(iv.n_a, iv.n_b), decision=intervals.decide(iv, at.margin),
                           margin=at.margin, pool_sd=at.pool.sd, pool_df=at.pool.df,
                           pool_configs=at.pool.configs)


def _against(row: pd.Series, base: pd.Series, at: LevelContext, basis: Basis, *,
             chosen_by: Literal["knee", "slos"] | None = None,
             baseline_meets_slos: bool = True) -> Verdict:
    """The Verdict on `row` against the plain baseline: its figures, the noise its gain was
    held against, its interval, its measurements and its windows."""
    spread = _spread(row, base, at)
    return Verdict(basis=basis, chosen_by=chosen_by, baseline_meets_slos=baseline_meets_slos,
                   subject=str(row["label"]), subject_throughput=float(row["output_throughput"]),
                   subject_tpot_ms=float(row["mean_tpot_ms"]),
                   baseline_throughput=float(base["output_throughput"]),
                   baseline_tpot_ms=float(base["mean_tpot_ms"]),
                   speedup=float(row["speedup_throughput"]), noise=noise.noise_of(spread),
                   noise_spread=spread.relative_throughput_spread,
                   noise_floor=spread.noise_floor, interval=_interval(row, at),
                   measurements=(int(_int(row["n_measurements"])),
                                 int(_int(base["n_measurements"]))),
                   windows=noise.window_spreads(row, base))



def _no_baseline(df: pd.DataFrame, at: LevelContext) -> Recommendation:
    failed = df[(df["state"] == "FAIL") & (df["role"] == Role.BASELINE)]
    waiting = df[df["state"].isin(["RUNNING", "WAITING"]) & (df["role"] == Role.BASELINE)]
    return at.answer("insufficient_data", Verdict(
        basis=Basis.NO_BASELINE,
        baseline_failure=str(failed["reason"].iloc[0]) if not failed.empty else None,
        baseline_waiting=failed.empty and not waiting.empty),
        verify_command=at.verify(TrialConfig()))


def _too_few_configs(candidates: pd.DataFrame, base: pd.Series, at: LevelContext) -> Recommendation:
    return at.answer("insufficient_data", Verdict(
        basis=Basis.TOO_FEW_CONFIGS, configs_completed=candidates["config_key"].nunique()),
        baseline_metrics=_metrics(base))


def _nothing_meets_the_slos(level: pd.DataFrame, base: pd.Series, at: LevelContext
                            ) -> Recommendation:
    best = level.sort_values("mean_tpot_ms").iloc[0]
    return at.answer("insufficient_data", Verdict(
        basis=Basis.NO_CONFIG_MEETS_SLOS, subject=str(best["label"]),
        subject_tpot_ms=float(best["mean_tpot_ms"]),
        subject_p99_ttft_ms=float(best["p99_ttft_ms"])), baseline_metrics=_metrics(base))


def _stays_off(best: pd.Series, base: pd.Series, at: LevelContext, basis: Basis) -> Recommendation:
    """Leave speculation off: serve the baseline; the verdict is about `best`, the fastest
    speculative config, whose verify command re-measures it beside the baseline."""
    return at.answer(
        "speculation_off", _against(best, base, at, basis), serving=TrialConfig(),
        decomposition=decomposition.record(best),
        metrics=_metrics(base), baseline_metrics=_metrics(base), label=str(base["label"]),
        trial=int(base["trial"]), speedup_throughput=1.0, speedup_tpot=1.0,
        spread=_spread(best, base, at), n_repeats=int(_int(base["n_repeats"])),
        verify_command=at.verify_against_baseline(at.config(best)))


def _speculation_off(candidates: pd.DataFrame, base: pd.Series, at: LevelContext) -> Recommendation:
    best = candidates.sort_values(["output_throughput", "trial"],
                                  ascending=[False, True]).iloc[0]
    return _stays_off(best, base, at, Basis.NOTHING_BEATS_BASELINE)


def _no_measurable_difference(best: pd.Series, base: pd.Series, at: LevelContext
                              ) -> Recommendation:
    """Speculation gains, but no more than the noise (or, where its speedup interval is
    settled, within --margin of 1.00x, or below it): not a finding, so it stays off."""
    basis = Basis.WITHIN_NOISE
    if at.interval(best) is not None and _beyond_floor(best, base, at):  # the interval decided
        basis = {intervals.EQUIVALENT: Basis.INTERVAL_EQUIVALENT,
                 intervals.OPEN: Basis.INTERVAL_OPEN}.get(at.decision(best),
                                                          Basis.INTERVAL_BELOW)
    return _stays_off(best, base, at, basis)


def _turn_on(win: pd.Series, base: pd.Series, at: LevelContext, *,
             chosen_by: Literal["knee", "slos"], base_feasible: bool) -> Recommendation:
    config = at.config(win)
    # Where the gain is within the noise floor, the settled interval decided (_finding).
    basis = Basis.INTERVAL_ABOVE if base_feasible and not _beyond_floor(win, base, at) \
        else Basis.BEYOND_NOISE
    return at.answer(
        "recommend", _against(win, base, at, basis, chosen_by=chosen_by,
                              baseline_meets_slos=base_feasible),
        serving=config, speculative_config=config.speculative_config, label=str(win["label"]),
        trial=int(win["trial"]), decomposition=decomposition.record(win),
        metrics=_metrics(win), speedup_throughput=float(win["speedup_throughput"]),
        speedup_tpot=float(win["speedup_tpot"]), baseline_metrics=_metrics(base),
        spread=_spread(win, base, at), n_repeats=int(_int(win["n_repeats"])),
        prediction_misses=at.misses(win), verify_command=at.verify(config))


def recommendations(df: pd.DataFrame, settings: StudySettings | None = None,
                    selections: Sequence[Selection] = ()) -> list[Recommendation]:
    """One Recommendation per measured concurrency level (in the order the study asked for
    them), with the study's stored SLOs; where the replay strategy selected over a workload
    sample (`selections`, tuner.replay.selection) and no SLO is set, the level's selection
    decides it (`selected`)."""
    slos = settings.constraints if settings else {}
    asked = settings.settings.concurrencies if settings else ()
    by_level = {s.concurrency: s for s in selections}
    unconstrained = not any(v is not None for v in slos.values())
    out = []
    for c in frame.levels_of(df, asked):
        rec = None
        if unconstrained and c in by_level:
            rec = selected(df, by_level[c], settings=settings)
        out.append(rec or recommend(df, concurrency=c, max_tpot_ms=slos.get("max_tpot_ms"),
                                    max_ttft_ms=slos.get("max_ttft_ms"), settings=settings))
    return out


def selected(df: pd.DataFrame, sel: Selection, *, settings: StudySettings | None = None
             ) -> Recommendation | None:
    """The level's Recommendation as its selection decided it: turn the subject on, leave
    speculation off, or undecided (no config named to serve; the verify command re-measures
    the subject beside the baseline). None where the frame lacks what it needs (no baseline
    at the level, or an "on" subject without a launch): the measured rule answers then."""
    c = sel.concurrency
    at = LevelContext(c, {"max_tpot_ms": None, "max_ttft_ms": None}, settings,
                configs=frame.configs_of(df))
    rows = df[(df["concurrency"] == c).fillna(False)]
    level = decomposition.decompose(pareto.speedups(frame.with_medians(
        rows[rows["state"] == "COMPLETE"]))).reset_index(drop=True)
    base_rows = level[frame.is_baseline(level)].sort_values("trial")
    if base_rows.empty:
        return None
    base = base_rows.iloc[0]
    mine = level[level["config_key"] == sel.subject_key]
    win = mine.iloc[0] if not mine.empty else None
    if sel.choice == Choice.ON and win is None:
        return None
    n_base = int(_int(base["n_measurements"]))
    verdict = Verdict(
        basis=Basis.SELECTED, selection=sel, subject=sel.subject, speedup=sel.speedup,
        baseline_throughput=float(base["output_throughput"]),
        baseline_tpot_ms=float(base["mean_tpot_ms"]),
        subject_throughput=float(win["output_throughput"]) if win is not None else None,
        subject_tpot_ms=float(win["mean_tpot_ms"]) if win is not None else None,
        measurements=(int(_int(win["n_measurements"])) if win is not None else 0, n_base))
    figures = dict(speedup_interval=None if sel.lo is None or sel.hi is None else (sel.lo, sel.hi),
                   confidence_level=sel.confidence,
                   equivalence_margin=sel.indifference, launches=verdict.measurements)
    if sel.choice == Choice.ON:
        config = at.config(win)
        return at.answer(
            "recommend", verdict, serving=config, speculative_config=config.speculative_config,
            label=sel.subject, trial=int(win["trial"]), decomposition=decomposition.record(win),
            metrics=_metrics(win), speedup_throughput=sel.speedup,
            speedup_tpot=float(win["speedup_tpot"]), baseline_metrics=_metrics(base),
            n_repeats=int(_int(win["n_repeats"])), verify_command=at.verify(config),
            **figures)
    subject = at.configs.get(sel.subject_key)
    verify = at.verify_against_baseline(subject) if subject else at.verify(TrialConfig())
    if sel.choice == Choice.OFF:
        return at.answer(
            "speculation_off", verdict, serving=TrialConfig(), metrics=_metrics(base),
            baseline_metrics=_metrics(base), label=str(base["label"]), trial=int(base["trial"]),
            speedup_throughput=1.0, speedup_tpot=1.0, n_repeats=int(_int(base["n_repeats"])),
            verify_command=verify, **figures)
    return at.answer("insufficient_data", verdict, baseline_metrics=_metrics(base),
                     verify_command=verify, **figures)


# The figures a recommendation carries, keyed and in the units `vllm bench serve` uses
# (acceptance rate in percent).
METRIC_KEYS = ("output_throughput", "mean_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "p99_ttft_ms",
               "spec_decode_acceptance_rate", "spec_decode_acceptance_length")


def _metrics(row: pd.Series) -> dict[str, float | None]:
    return {k: frame.optional(row.get(k)) for k in METRIC_KEYS}


def _int(value: Any) -> int:
    return 0 if value is None or pd.isna(value) else int(value)


def _spread(row: pd.Series, base: pd.Series, at: LevelContext) -> ThroughputSpread:
    return noise.throughput_spread(row, base, single_run_spread=at.single_run_spread)
