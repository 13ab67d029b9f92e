"""Analysis stage, the recommendation: per concurrency level, the config to run, "leave
speculation off", or a refusal when the data cannot support a choice; each carries its
Verdict (the basis it rests on and the figures: repeats, spread, interval), which
tuner.outputs.verdicts turns into words, and the serve and verify commands (the model
named as the user gave it, the serve flags also as a `vllm serve --config` mapping, and a note
where the command names other weights than those measured). Where the
study measured an aligned baseline, the speedup over the plain baseline is split into the
engine path's cost and speculation's own gain (tuner.analysis.decomposition), in the record
and its reason. The speedup carries its interval across launches (tuner.intervals, at the
study's --confidence): where the interval is settled (above 1.00x, below, or within --margin)
it decides whether a gain counts; where it is open, the gain must pass the noise floor.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from tuner import engine_cmdline, intervals
from tuner.analysis import decomposition, frame, pareto
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.records.predictions import PredictionMiss
from tuner.records.recommendations import (
    Basis,
    Noise,
    Recommendation,
    SpeedupInterval,
    Status,
    ThroughputSpread,
    Verdict,
    WindowSpread,
)
from tuner.records.selection import Choice, Selection
from tuner.records.storage import StudySettings
from tuner.records.trials import Role

# A recommendation needs a choice: at least this many distinct speculative configs measured.
MIN_CANDIDATES = 2


@dataclass(frozen=True)
class _Level:
    """What every answer at one level carries: the level, its SLOs, the study's settings."""

    concurrency: int
    slos: dict[str, float | None]
    # The study's settings (model, workload, decision rule, what the replay found); None where
    # the frame comes without a study (tests, a frame built by hand).
    settings: StudySettings | None = None
    # The spread taken for a speculative config measured once (_single_run_spread).
    single_run_spread: float = 0.05
    # config key -> TrialConfig (frame.configs_of): the records behind the rows.
    configs: Mapping[str, TrialConfig] = field(default_factory=dict)
    # config key -> each launch's throughput at this level (frame.launch_throughputs), their
    # between-launch spread pooled (tuner.intervals), and the plain baseline's key.
    runs: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    pool: intervals.Pool = field(default_factory=intervals.Pool)
    base_key: str = ""
    # config key -> each launch's windows at this level (frame.launch_windows): the paired
    # within-level spread each interval adds (tuner.intervals.Within).
    windows: Mapping[str, tuple[intervals.LaunchWindows, ...]] = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        """The study's --confidence (a fraction), stored with its settings."""
        stored = self.settings.confidence if self.settings else None
        return intervals.CONFIDENCE if stored is None else float(stored)

    @property
    def margin(self) -> float:
        """The study's --margin (a fraction): within it of 1.00x is no difference."""
        stored = self.settings.margin if self.settings else None
        return intervals.MARGIN if stored is None else float(stored)

    def interval(self, row: pd.Series) -> intervals.Interval | None:
        """The row's speedup over the plain baseline across launches, with its interval."""
        within = intervals.Within.paired(self.windows.get(row["config_key"], ()),
                                         self.windows.get(self.base_key, ()))
        return intervals.speedup(self.runs.get(row["config_key"], ()),
                                 self.runs.get(self.base_key, ()), pool=self.pool,
                                 confidence=self.confidence, within=within)

    def decision(self, row: pd.Series) -> intervals.Decision | None:
        """What the row's interval says against 1.00x (intervals.decide); None without one."""
        iv = self.interval(row)
        return None if iv is None else intervals.decide(iv, self.margin)

    def answer(self, status: Status, verdict: Verdict, *, serving: TrialConfig | None = None,
               **extra: Any) -> Recommendation:
        """The Recommendation: `verdict` with what the level knows, its interval's figures,
        and where `serving` names the config to serve, its serve command, the same as a `vllm
        serve --config` mapping and the note beside them (tuner.engine_cmdline.serve_note)."""
        iv = verdict.interval
        if serving is not None:
            s = self.settings
            extra.update(
                serve_command=engine_cmdline.serve_command(_shown_engine(s), serving),
                serve_config=serve_config(s, serving),
                serve_note=engine_cmdline.serve_note(s.engine_spec if s else None))
        figures: dict[str, Any] = dict(
            speedup_interval=None if iv is None else (iv.lo, iv.hi),
            confidence_level=None if iv is None else iv.confidence,
            equivalence_margin=None if iv is None else iv.margin,
            launches=None if iv is None else iv.launches)
        return Recommendation(
            concurrency=self.concurrency, status=status, slos=self.slos,
            verdict=verdict.model_copy(update={
                "sampling_mismatch": self.sampling_mismatch,
                "slos_set": any(v is not None for v in self.slos.values())}),
            **{**figures, **extra})

    @property
    def sampling_mismatch(self) -> str | None:
        """The line where the engine's measured acceptance at this level did not match the
        replay at temperature > 0 (StudySettings.sampling_mismatch, written by the replay
        strategy)."""
        return self.settings.sampling_mismatch.get(str(self.concurrency)) \
            if self.settings else None

    def misses(self, row: pd.Series) -> tuple[PredictionMiss, ...]:
        """The replay's misses of the row's config at this level (StudySettings.prediction_misses, written
        by the replay strategy): a recommendation resting on it says so."""
        found = self.settings.misses_at(self.concurrency) if self.settings else ()
        return tuple(m for m in found if m.key == row["config_key"])

    def config(self, row: pd.Series) -> TrialConfig:
        return self.configs[row["config_key"]]

    def verify(self, config: TrialConfig) -> str:
        s = self.settings
        return engine_cmdline.verify_command(
            engine=s.engine_spec if s else None, workload=s.workload if s else None,
            config=config, concurrency=self.concurrency, settings=s.settings if s else None)

    def verify_against_baseline(self, config: TrialConfig) -> str:
        """The baseline's verify line, then `config`'s: a "leave speculation off" verdict is
        checked by re-measuring the best speculative config beside the baseline, now."""
        return f"{self.verify(TrialConfig())} && {self.verify(config)}"


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
    at = _Level(concurrency, {"max_tpot_ms": max_tpot_ms, "max_ttft_ms": max_ttft_ms},
                settings, configs=frame.configs_of(df))
    rows = df[(df["concurrency"] == concurrency).fillna(False)]
    level = decomposition.decompose(pareto.speedups(frame.with_medians(
        rows[rows["state"] == "COMPLETE"]))).reset_index(drop=True)
    base_rows = level[frame.is_baseline(level)].sort_values("trial")
    if base_rows.empty:
        return _no_baseline(df, at)
    base = base_rows.iloc[0]
    runs = frame.launch_throughputs(df, concurrency)
    at = replace(at, single_run_spread=_single_run_spread(level), runs=runs,
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


def _beyond_floor(row: pd.Series, base: pd.Series, at: _Level) -> bool:
    """Whether the row's gain exceeds the noise floor (noise_floor of the MADs)."""
    return _gain(row) > _spread(row, base, at).noise_floor


def _finding(row: pd.Series, base: pd.Series, at: _Level) -> bool:
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


def _interval(row: pd.Series, at: _Level) -> SpeedupInterval | None:
    """The row's speedup over the plain baseline across launches, as the verdict holds it."""
    iv = at.interval(row)
    if iv is None:
        return None
    return SpeedupInterval(point=iv.point, lo=iv.lo, hi=iv.hi, confidence=iv.confidence,
                           launches=(iv.n_a, iv.n_b), decision=intervals.decide(iv, at.margin),
                           margin=at.margin, pool_sd=at.pool.sd, pool_df=at.pool.df,
                           pool_configs=at.pool.configs)


def _against(row: pd.Series, base: pd.Series, at: _Level, basis: Basis, *,
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
                   speedup=float(row["speedup_throughput"]), noise=_noise(spread),
                   noise_spread=spread.relative_throughput_spread,
                   noise_floor=spread.noise_floor, interval=_interval(row, at),
                   measurements=(int(_int(row["n_measurements"])),
                                 int(_int(base["n_measurements"]))),
                   windows=_window_spreads(row, base))


def _noise(spread: ThroughputSpread) -> Noise:
    """Which spread the gain was held against: the one `_spread` took as the largest."""
    spread_rel = spread.relative_throughput_spread
    if spread_rel is None:
        return Noise.UNMEASURED
    for taken, noise in ((spread.paired_window_spread, Noise.PAIRED_WINDOWS),
                         (spread.unsettled_spread, Noise.UNSETTLED_WINDOWS),
                         (spread.single_run_spread, Noise.SINGLE_RUN)):
        if taken is not None and spread_rel == taken:
            return noise
    return Noise.MEASURED if spread_rel >= MIN_DIFFERENCE else Noise.FLOOR


def _no_baseline(df: pd.DataFrame, at: _Level) -> Recommendation:
    failed = df[(df["state"] == "FAIL") & (df["role"] == Role.BASELINE)]
    waiting = df[df["state"].isin(["RUNNING", "WAITING"]) & (df["role"] == Role.BASELINE)]
    return at.answer("insufficient_data", Verdict(
        basis=Basis.NO_BASELINE,
        baseline_failure=str(failed["reason"].iloc[0]) if not failed.empty else None,
        baseline_waiting=failed.empty and not waiting.empty),
        verify_command=at.verify(TrialConfig()))


def _too_few_configs(candidates: pd.DataFrame, base: pd.Series, at: _Level) -> Recommendation:
    return at.answer("insufficient_data", Verdict(
        basis=Basis.TOO_FEW_CONFIGS, configs_completed=candidates["config_key"].nunique()),
        baseline_metrics=_metrics(base))


def _nothing_meets_the_slos(level: pd.DataFrame, base: pd.Series, at: _Level
                            ) -> Recommendation:
    best = level.sort_values("mean_tpot_ms").iloc[0]
    return at.answer("insufficient_data", Verdict(
        basis=Basis.NO_CONFIG_MEETS_SLOS, subject=str(best["label"]),
        subject_tpot_ms=float(best["mean_tpot_ms"]),
        subject_p99_ttft_ms=float(best["p99_ttft_ms"])), baseline_metrics=_metrics(base))


def _stays_off(best: pd.Series, base: pd.Series, at: _Level, basis: Basis) -> Recommendation:
    """Leave speculation off: serve the baseline; the verdict is about `best`, the fastest
    speculative config, whose verify command re-measures it beside the baseline."""
    return at.answer(
        "speculation_off", _against(best, base, at, basis), serving=TrialConfig(),
        decomposition=decomposition.record(best),
        metrics=_metrics(base), baseline_metrics=_metrics(base), label=str(base["label"]),
        trial=int(base["trial"]), speedup_throughput=1.0, speedup_tpot=1.0,
        spread=_spread(best, base, at), n_repeats=int(_int(base["n_repeats"])),
        verify_command=at.verify_against_baseline(at.config(best)))


def _speculation_off(candidates: pd.DataFrame, base: pd.Series, at: _Level) -> Recommendation:
    best = candidates.sort_values(["output_throughput", "trial"],
                                  ascending=[False, True]).iloc[0]
    return _stays_off(best, base, at, Basis.NOTHING_BEATS_BASELINE)


def _no_measurable_difference(best: pd.Series, base: pd.Series, at: _Level
                              ) -> Recommendation:
    """Speculation gains, but no more than the noise (or, where its speedup interval is
    settled, within --margin of 1.00x, or below it): not a finding, so it stays off."""
    basis = Basis.WITHIN_NOISE
    if at.interval(best) is not None and _beyond_floor(best, base, at):  # the interval decided
        basis = {intervals.EQUIVALENT: Basis.INTERVAL_EQUIVALENT,
                 intervals.OPEN: Basis.INTERVAL_OPEN}.get(at.decision(best),
                                                          Basis.INTERVAL_BELOW)
    return _stays_off(best, base, at, basis)


def _turn_on(win: pd.Series, base: pd.Series, at: _Level, *,
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
    at = _Level(c, {"max_tpot_ms": None, "max_ttft_ms": None}, settings,
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


# Without repeats the spread is unknown: single runs on shared machines differ by a few
# percent, so a gain up to this is not evidence.
UNMEASURED_NOISE = 0.05
# The smallest throughput gain counted as a finding even where the measured spread is smaller:
# a MAD of two or three runs understates the spread (of two runs it is half their gap; two
# identical runs give zero), and tuner.analysis.ladder_stats never claims less than 1% for
# either of the two series a speedup divides, so their ratio is not known better than 2%.
MIN_DIFFERENCE = 0.02


def noise_floor(spread_rel: float | None) -> float:
    """The gain over the baseline (a fraction) a config must exceed for its difference to be
    a finding: the measured relative spread, never less than MIN_DIFFERENCE; UNMEASURED_NOISE
    when neither the config nor the baseline was re-measured."""
    return UNMEASURED_NOISE if spread_rel is None else max(spread_rel, MIN_DIFFERENCE)


def _relative_mad(row: pd.Series) -> float | None:
    return frame.optional(frame.relative_spread(row))


def _single_run_spread(level: pd.DataFrame) -> float:
    """The spread taken for a speculative config measured once: the largest relative MAD of
    the level's repeated speculative configs, never less than UNMEASURED_NOISE. A speculative
    engine can be noisier than the baseline (on the H200, two runs of one n-gram config
    differed by 24% where the baseline's differed by 5%), so the baseline's spread alone
    would pass a single lucky run as a finding."""
    spec = level[(level["method"] != "none") & (level["n_measurements"].fillna(0) >= 2)]
    rels = [r for _, row in spec.iterrows() if (r := _relative_mad(row)) is not None]
    return max([UNMEASURED_NOISE, *rels])


def _spread(win: pd.Series, base: pd.Series, at: _Level) -> ThroughputSpread:
    own = _relative_mad(win)
    rels = [r for r in (own, _relative_mad(base)) if r is not None]
    single = unsettled = paired = None
    if rels and win["method"] != "none" and own is None:
        # Measured once, beside a re-measured baseline: no surer than its speedup moved
        # across the windows it shares with the baseline (the same requests), or, for a
        # study stored before the schedule, than its own windows where they did not settle.
        paired = _paired_window_spread(win, base)
        unsettled = None if paired is not None else _unsettled_spread(win)
        single = max(at.single_run_spread, paired or unsettled or 0.0)
        rels.append(single)
    return ThroughputSpread(
        output_throughput_median=frame.optional(win["output_throughput_median"]),
        output_throughput_mad=frame.optional(win["output_throughput_mad"]),
        mean_tpot_ms_median=frame.optional(win["mean_tpot_ms_median"]),
        mean_tpot_ms_mad=frame.optional(win["mean_tpot_ms_mad"]),
        baseline_output_throughput_mad=frame.optional(base["output_throughput_mad"]),
        relative_throughput_spread=max(rels) if rels else None,
        noise_floor=noise_floor(max(rels) if rels else None), single_run_spread=single,
        paired_window_spread=paired, unsettled_spread=unsettled)


def _paired_window_spread(win: pd.Series, base: pd.Series) -> float | None:
    """How far `win`'s speedup over `base` moves within the level, a fraction: half the range
    over the median of the per-window throughput ratios, window j of both launches holding
    the same requests (tuner.measure.windows; equal prompts digests). None where the two
    levels were not measured on the same requests or carry fewer than two windows."""
    digest = win.get("prompts_digest")
    if not isinstance(digest, str) or digest != base.get("prompts_digest"):
        return None
    a, b = win.get("windows"), base.get("windows")
    if not isinstance(a, (tuple, list)) or not isinstance(b, (tuple, list)) \
            or len(a) != len(b) or len(a) < 2:
        return None
    ratios = sorted(x / y for x, y in zip(a, b, strict=True)
                    if math.isfinite(x) and math.isfinite(y) and y > 0)
    if len(ratios) < 2:
        return None
    return (ratios[-1] - ratios[0]) / 2 / statistics.median(ratios)


def _unsettled_spread(row: pd.Series) -> float | None:
    """How far the windows of a level that did not converge moved (a fraction), the figure
    of its one launch moving as much; None where it converged or had no windows. On the
    H100 a leader measured once at 1.19x had windows that never settled (±22.7%), and the
    plain baseline's two launches measured 519 and 574 tok/s."""
    pct, settled = _windows(row)
    return None if pct is None or settled else pct / 100.0


def _windows(row: pd.Series) -> tuple[float | None, bool]:
    """A row's window spread in percent (None: measured without windows) and whether its
    windows settled (a level stored before windows counts as settled)."""
    converged = row.get("converged")
    return (frame.optional(row.get("stability_pct")),
            not (isinstance(converged, (bool, np.bool_)) and not converged))


def _window_spreads(win: pd.Series, base: pd.Series) -> tuple[WindowSpread, ...]:
    """Where the two rows' levels were measured in windows (tuner.measure.windows): how far
    each launch's own windows spread, and whether they settled."""
    out = []
    for row, who in ((win, str(win["label"])), (base, "the baseline")):
        pct, settled = _windows(row)
        if pct is not None:
            out.append(WindowSpread(label=who, pct=pct, settled=settled))
    return tuple(out)


def _int(value: Any) -> int:
    return 0 if value is None or pd.isna(value) else int(value)


# --- commands -----------------------------------------------------------------------------


def _shown_engine(settings: StudySettings | None) -> EngineSpec:
    """The study's engine with the model as the user named it (the resolved path stays in the
    fingerprint); a study stored before names were kept shows its path."""
    spec = settings.engine_spec if settings else EngineSpec(model="MODEL")
    return spec.model_copy(update={"model": spec.model_name or spec.model})


def serve_config(settings: StudySettings | None, config: TrialConfig) -> dict[str, Any]:
    """The serve command as the mapping `vllm serve --config FILE.yaml` reads: each option's
    name without its dashes, the speculative config as a mapping, a flag as true (`--no-x`
    as `x: false`), JSON values as mappings. A short flag the mapping cannot name is kept
    under its own spelling, so nothing measured is dropped silently."""
    import yaml

    spec = _shown_engine(settings)
    out: dict[str, Any] = {"model": spec.model}
    if config.speculative_config:
        out["speculative-config"] = dict(config.speculative_config)
    argv = engine_cmdline.engine_flags(config) + list(spec.extra_args)
    for flag in engine_cmdline.parse_flags(argv):
        if flag.value is None:
            if flag.name.startswith("no-"):
                out[flag.name[3:]] = False
            else:
                out[flag.name] = True
            continue
        try:  # "4096" -> 4096, '{"a": 1}' -> {"a": 1}; "4k" stays text, as vLLM reads it
            parsed = yaml.safe_load(flag.value)
        except yaml.YAMLError:
            parsed = flag.value
        out[flag.name] = parsed if isinstance(parsed, (int, float, dict, list)) and not \
            isinstance(parsed, bool) else flag.value
    return out
