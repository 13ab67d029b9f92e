"""Search stage, the policy ladder: measure a fixed list of configs on a concurrency ladder, with
repeats.

Used by the load-aware policy step. Runs are interleaved (baseline, A, B, ..., then the next
repeat) so slow drift of a shared machine hits every config alike. Each run is one engine
launch measured at every ladder level and is stored as a trial of a companion Optuna study
(`<study>.policy`) in the same storage, so a killed campaign resumes where it stopped and
reports regenerate from storage. A run that fails is recorded with its reason, never fatal;
a run's token capture stays in its folder, named in its attrs. Stored runs are read back as
tuner.records.policy.LadderRun, parsed from the attrs once (stored_runs). The phase
"open_loop" (measure_open_loop) drives chosen levels at a request rate instead of the closed
loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.records.configs import (
    EngineSpec,
    MeasureSettings,
    RequestSchedule,
    TrialConfig,
    Workload,
)
from tuner.records.policy import LadderRun
from tuner.records.storage import TrialAttr
from tuner.records.trials import TrialOutcome
from tuner.search import optuna_compat, outcomes
from tuner.search import study as st

# One run measured into its folder: a result or a failure, never an exception.
MeasureRun = Callable[[TrialConfig, Path], TrialOutcome]
RunKey = tuple[Any, Any, Any]  # (phase, config key, repeat) as a run's attrs store them


@dataclass(frozen=True)
class Campaign:
    """What every run of a campaign shares: the study (whose companion keeps the runs), the
    engine and workload, the ladder (`settings.concurrencies`, with its requests per slot), how
    many times each config is measured, the study folder, and where progress is said."""

    study: Any
    engine: EngineSpec
    workload: Workload
    settings: MeasureSettings
    repeats: int
    out_dir: Path
    say: Callable[[str], None] = print
    schedule: RequestSchedule | None = None  # None: built from the workload and the settings

    def measure_run(self, config: TrialConfig, run_dir: Path) -> TrialOutcome:
        """Launch the engine with `config` and measure it on the ladder (tuner.measure)."""
        from tuner.measure import trial as runner

        return runner.measure_outcome(self.engine, config, self.workload, self.settings,
                                      str(run_dir), schedule=self.schedule)


@dataclass(frozen=True)
class Launch:
    """One launch of a phase: the n-th of its schedule (from 1), repeat `repeat` of `config`."""

    n: int
    repeat: int
    role: str
    config: TrialConfig


def companion(study: Any) -> Any:
    """The study `<study>.policy` in the same storage, created on first use."""
    import optuna

    return optuna.create_study(study_name=f"{study.study_name}.policy",
                               storage=optuna_compat.storage_of(study), direction="maximize",
                               load_if_exists=True)


def measure(campaign: Campaign, *, lineup: Sequence[tuple[str, TrialConfig]], phase: str,
            measure_run: MeasureRun | None = None) -> list[LadderRun]:
    """Measure each (role, config) of `lineup` `campaign.repeats` times on the ladder,
    interleaved; a run this phase already holds complete is not measured again.
    `measure_run`: how one run is measured (default: Campaign.measure_run). Returns every
    stored run of this phase."""
    comp = companion(campaign.study)
    fail_left_running(comp)
    done = done_keys(comp)
    plan = schedule(lineup, campaign.repeats)
    for launch in plan:
        if run_key(phase, launch.config, launch.repeat) not in done:
            _measure(comp, campaign, launch, phase=phase, total=len(plan),
                     measure_run=measure_run or campaign.measure_run)
    return stored_runs(campaign.study, phase)


OPEN_LOOP = "open_loop"


def measure_open_loop(campaign: Campaign, *, lineup: Sequence[tuple[str, TrialConfig]],
                      rates: dict[int, float], measure_run: MeasureRun | None = None
                      ) -> list[LadderRun]:
    """measure() in the phase "open_loop": each run's engine measured at the levels of
    `rates` only ({concurrency cap: requests/s}), their measured requests (the same the
    ladder sends at those levels) arriving Poisson at that rate, at most the level's
    concurrency in flight. Interleaved, repeated and resumed like every phase."""
    from tuner.measure.trial import OpenLoopSettings

    settings = OpenLoopSettings(**{**campaign.settings.model_dump(),
                                   "concurrencies": tuple(sorted(rates)),
                                   "request_rates": dict(rates)})
    open_loop = dataclasses.replace(campaign, settings=settings)
    return measure(open_loop, lineup=lineup, phase=OPEN_LOOP, measure_run=measure_run)


def schedule(lineup: Sequence[tuple[str, TrialConfig]], repeats: int) -> list[Launch]:
    """Every launch in order: each repeat measures every config once before the next repeat
    starts (baseline, A, B, baseline, A, B)."""
    order = [(rep, role, config) for rep in range(repeats) for role, config in lineup]
    return [Launch(n, rep, role, config) for n, (rep, role, config) in enumerate(order, 1)]


def run_key(phase: str | None, config: TrialConfig, repeat: int) -> RunKey:
    """What makes a run the same run on resume: its phase, config and repeat index."""
    return phase, config.key(), repeat


def done_keys(comp: Any) -> set[RunKey]:
    """The run keys the companion study holds complete (a failed run is measured again)."""
    from optuna.trial import TrialState

    return {st.ladder_run_key(t)
            for t in comp.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}


def fail_left_running(comp: Any) -> None:
    """Mark FAIL the runs a killed driver left RUNNING (the study lock admits one driver, so
    none is live); they are measured again."""
    from optuna.trial import TrialState

    storage = optuna_compat.storage_of(comp)
    for t in comp.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        storage.set_trial_state_values(optuna_compat.trial_id(t), TrialState.FAIL)


def _run_attrs(launch: Launch, phase: str, settings: MeasureSettings) -> dict[str, Any]:
    """The attrs a run's trial is stored with (read back by stored_runs)."""
    return {TrialAttr.PHASE: phase, TrialAttr.ROLE: launch.role,
            TrialAttr.CONFIG_KEY: launch.config.key(), TrialAttr.REPEAT: launch.repeat,
            TrialAttr.LABEL: launch.config.label(), "ladder": list(settings.concurrencies),
            TrialAttr.CONFIG: launch.config.model_dump(mode="json")}


def _measure(comp: Any, campaign: Campaign, launch: Launch, *, phase: str, total: int,
             measure_run: MeasureRun) -> None:
    """Measure one launch as a trial of the companion study and say how it went."""
    from optuna.trial import TrialState

    trial = comp.ask()
    for key, value in _run_attrs(launch, phase, campaign.settings).items():
        trial.set_user_attr(key, value)
    if rates := getattr(campaign.settings, "request_rates", None):
        trial.set_user_attr("request_rates", {str(c): r for c, r in sorted(rates.items())})
    run_dir = campaign.out_dir / "policy" / f"run{trial.number}"
    outcome = measure_run(launch.config, run_dir)
    head = f"  [{phase} {launch.n}/{total}] {launch.config.label()}: "
    if outcome.failure is not None:
        trial.set_user_attr(TrialAttr.FAILURE, outcome.failure.model_dump())
        comp.tell(trial, state=TrialState.FAIL)
        campaign.say(f"{head}FAIL ({outcome.failure.kind}) {outcome.failure.reason[:200]}")
        return
    result = outcome.result
    assert result is not None  # an outcome holds a result or a failure
    if outcome.tokens is not None:
        st.store_tokens(campaign.out_dir, trial, outcome.tokens, trial_dir=run_dir)
    trial.set_user_attr(TrialAttr.RESULT, outcomes.result_attr(result))
    comp.tell(trial, result.levels[0].output_throughput)
    campaign.say(head + " | ".join(
        f"c={lv.concurrency}" + ("" if lv.request_rate is None else f" at {lv.request_rate:.2f}"
                                 " req/s") + f" {lv.output_throughput:.1f} tok/s"
        for lv in result.levels))


def stored_runs(study: Any, phase: str | None = None) -> list[LadderRun]:
    """Every finished run of the companion study (of `phase` only, when given), in launch
    order; [] before the first campaign."""
    import optuna
    from optuna.trial import TrialState

    try:
        comp = optuna.load_study(study_name=f"{study.study_name}.policy",
                                 storage=optuna_compat.storage_of(study))
    except KeyError:
        return []
    return [st.ladder_run(t)
            for t in comp.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
            if phase is None or st.ladder_run_key(t)[0] == phase]
