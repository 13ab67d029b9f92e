"""Search stage, the strategy interface: which config to launch next, or stop and why.

The loop (tuner.search.loop SearchLoop) owns launching: it hands a strategy a StudyView (what
it may read of the study and the budget, built afresh for each ask), launches the strategy's
pick as a trial of the study, stores the outcome and tells the strategy, until the strategy
stops with nothing in flight. A strategy never launches, never imports the loop and never
tells the study a trial's outcome (a proposal storage already answers is answered by the
loop), as an Optuna sampler reads its study. Three implementations: `OptunaSearch` here
(Optuna's samplers, through ask/tell), `Repeats` here (--repeats: the leaders re-measured after
the search) and tuner.search.replay_strategy ReplaySearch (predict, then confirm).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from optuna.trial import FrozenTrial, TrialState

from tuner import intervals
from tuner.records import decisions as ev
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, Workload
from tuner.records.selection import Selection
from tuner.records.storage import StoredTrial
from tuner.records.trials import Role
from tuner.search import outcomes
from tuner.search import study as st
from tuner.search.space import SearchSpace


class StopReason(str, Enum):
    """Why a strategy stopped."""

    BUDGET = "budget"  # --n-trials: every trial (replay: engine launch) of the budget is spent
    TIMEOUT = "timeout"  # --timeout reached
    EXHAUSTED = "exhausted"  # every config of a finite space is measured or refused
    REPEATING = "repeating"  # the sampler keeps proposing configs storage already answers
    DECIDED = "decided"  # replay: the confirm launches decided the ranking
    UNDECIDED = "undecided"  # replay: what is open no launch can decide (the sample's spread)
    NO_LEADER = "no_leader"  # replay: no predicted leader to confirm, or every one failed
    BASELINE_FAILED = "baseline_failed"  # replay: a baseline failed to re-measure
    NO_BASELINE = "no_baseline"  # replay: no budget for the baseline, or it failed
    NO_TOKENS = "no_tokens"  # replay: the baseline holds no token ids (Optuna takes over)
    REPEATED = "repeated"  # --repeats: every repeat of the leaders is launched


@dataclass(frozen=True)
class Launch:
    """Launch `config` as a new trial of the study, in `role`; `repeat_of`: the trial a repeat
    re-measures; `trial`: the Optuna trial a sampler proposed it on, which the loop answers
    from storage where storage knows its config (None: the loop opens a fresh one, whose
    config override is `config`, and launches it as asked)."""

    config: TrialConfig
    role: Role
    repeat_of: int | None = None
    trial: Any = None


@dataclass(frozen=True)
class Stop:
    """The strategy is done: why, and (replay) the ranking its confirm launches reached,
    which tuner.outputs.ranking words."""

    reason: StopReason
    ranking: intervals.Ranking | None = None
    # replay over a workload sample: each level's selection (tuner.replay.selection)
    selections: tuple[Selection, ...] = ()


Step = Launch | Stop


@dataclass(frozen=True)
class StudyView:
    """What a strategy sees when it is asked: the study to read (OptunaSearch also has its
    sampler propose on it), the space, the levels and the engine, the budget (--n-trials,
    --timeout, the launches in flight), and the loop's answers: `room()` (None while the
    budget leaves room for a launch, else which part ran out), `align()` (the aligned baseline
    due now, decided once per study), `exhausted()` and `space_size()` (a finite space every
    config of which storage answers), `config_of(trial)` (a proposed trial's config); and
    `record(event, store=True, show=True)`, where the events it finds go
    (tuner.records.decisions; tuner.search.loop LoopOutput)."""

    study: Any
    space: SearchSpace
    target: int
    settings: MeasureSettings
    workload: Workload
    engine: EngineSpec
    n_trials: int
    timeout_s: float | None
    in_flight: int
    requests_per_launch: int
    room: Callable[[], StopReason | None]
    align: Callable[[], TrialConfig | None]
    exhausted: Callable[[], bool]
    space_size: Callable[[], int]
    config_of: Callable[[Any], TrialConfig]
    record: Callable[..., None]


class Strategy(Protocol):
    """Which config next, or stop and why. `ask` is called while the executor has room; a
    `sequential` strategy only once its last launch is told (each pick rests on it);
    `counts_repeats`: whether --n-trials counts repeat launches (SearchLoop.budget)."""

    sequential: bool
    counts_repeats: bool

    def ask(self, view: StudyView) -> Step:
        """The next launch, or the stop (asked again after each outcome while trials run)."""
        ...

    def tell(self, launch: Launch, trial: FrozenTrial | None) -> None:
        """`launch` ended: its trial where it completed, None where it failed."""
        ...


class OptunaSearch:
    """Optuna's samplers as a strategy: the study's enqueued trials (the baseline, the space's
    start points, a grid) first, then the sampler's picks, the aligned baseline as soon as the
    loop says it is due. A proposal storage already answers (a config measured or refused) is
    answered by the loop (SearchLoop.answer_known), which asks again."""

    sequential = False
    counts_repeats = False

    def ask(self, view: StudyView) -> Step:
        room = view.room()
        if room == StopReason.TIMEOUT:
            if not view.in_flight:  # said once the running trials have ended
                view.record(ev.BudgetSpent(limit="timeout", timeout_s=view.timeout_s))
            return Stop(room)
        if room is not None:
            return Stop(room)
        aligned = view.align()
        if aligned is None and not view.study.get_trials(
                deepcopy=False, states=(TrialState.WAITING,)) and view.exhausted():
            view.record(ev.SpaceExhausted(space=view.space.name, configs=view.space_size()))
            return Stop(StopReason.EXHAUSTED)
        trial = self._propose(view.study, aligned)
        config = view.config_of(trial)
        role = Role(st.stored(trial).role or Role.SEARCH)
        if config.method == "none" and role != Role.ALIGNED_BASELINE:
            role = Role.BASELINE
        role = Role.SEARCH if role == Role.RETRY else role
        return Launch(config, role, trial=trial)

    @staticmethod
    def _propose(study: Any, aligned: TrialConfig | None) -> Any:
        """The sampler's next trial; the aligned baseline's own one where it is due: it runs
        next, not behind the queued grid points, so the ratios it splits are measured under the
        same conditions as the trials around it."""
        if aligned is None:
            return study.ask()
        return outcomes.ask_fresh(study, user_attrs=outcomes.aligned_attrs(aligned))

    def tell(self, launch: Launch, trial: FrozenTrial | None) -> None:
        return None  # the loop told the study; the sampler reads it from there


class Repeats:
    """--repeats after the search: re-measure the baseline (and the aligned one) and the
    leading configs, each on a trial of its own, so the ranking can use their spread; the
    loop launches them outside --n-trials."""

    sequential = True
    counts_repeats = True

    def __init__(self, launches: list[Launch]) -> None:
        self.launches = list(launches)

    @classmethod
    def of_leaders(cls, study: Any, *, target: int, repeats: int, leaders: int = 3) -> Repeats:
        """The repeats still due: `repeats` runs in all of the plain baseline, the aligned one
        and the `leaders` best speculative configs by output throughput at `target`."""
        trials = [(t, s) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                  if (s := st.stored(t)).duplicate_of is None and s.config is not None]
        originals = [(t, s) for t, s in trials if s.role != Role.REPEAT]
        spec = sorted(((t, s) for t, s in originals if s.config.speculative_config),
                      key=lambda ts: -_throughput(ts[1], target))[:leaders]
        base = [(t, s) for t, s in originals if st.is_baseline(t)][:1]
        # The aligned baseline is repeated with the plain one: the path's cost is a ratio too.
        base += [(t, s) for t, s in originals if s.role == Role.ALIGNED_BASELINE][:1]
        # The stored config itself, on a trial of its own: study.ask() would hand out a
        # WAITING grid point instead, and a re-sampled config might not be this one.
        return cls([Launch(s.config, Role.REPEAT, repeat_of=s.number)
                    for _, s in base + spec
                    for _ in range(repeats - 1 - sum(
                        1 for _, r in trials if r.repeat_of == s.number))])

    def ask(self, view: StudyView) -> Step:
        if not self.launches:
            return Stop(StopReason.REPEATED)
        launch = self.launches.pop(0)
        view.record(ev.RepeatOf(trial=int(launch.repeat_of or 0),
                                label=launch.config.label()), store=False)
        return launch

    def tell(self, launch: Launch, trial: FrozenTrial | None) -> None:
        return None


def _throughput(trial: StoredTrial, c: int) -> float:
    """A trial's output throughput at level `c`; NaN where it has none."""
    level = None if trial.result is None else trial.result.level(c)
    return float("nan") if level is None else float(level.output_throughput)
