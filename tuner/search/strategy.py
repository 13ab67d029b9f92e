"""Search stage, the strategy interface: which config to launch next, or stop and why.

The loop (tuner.search.loop SearchLoop.run) owns launching: it asks a strategy for its next
step, launches it as a trial of the study, stores the outcome and tells the strategy, until
the strategy stops with nothing in flight. A strategy never launches and reads the loop only
through its public calls (the budget left, `room`; the aligned baseline due, `align`), as an
Optuna sampler reads its study. Two implementations: `OptunaSearch` here (Optuna's samplers,
through ask/tell) and tuner.search.replay_strategy ReplaySearch (predict, then confirm).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from optuna.trial import FrozenTrial, TrialState

from tuner import intervals
from tuner.records.configs import TrialConfig
from tuner.records.results import Role
from tuner.records.selection import Selection
from tuner.records.storage import TrialAttr
from tuner.search import study as st

if TYPE_CHECKING:
    from tuner.search.loop import SearchLoop

# Proposals in a row that storage already answers before the sampler counts as stuck.
MAX_KNOWN_IN_ROW = 25


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


@dataclass(frozen=True)
class Launch:
    """Launch `config` as a new trial of the study, in `role`; `repeat_of`: the trial a repeat
    re-measures; `trial`: the Optuna trial a sampler proposed it on (None: the loop opens a
    fresh one, whose config override is `config`)."""

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


class Strategy(Protocol):
    """Which config next, or stop and why. `ask` is called while the executor has room; a
    `sequential` strategy only once its last launch is told (each pick rests on it);
    `counts_repeats`: whether --n-trials counts repeat launches (SearchLoop.budget)."""

    sequential: bool
    counts_repeats: bool

    def ask(self) -> Step:
        """The next launch, or the stop (asked again after each outcome while trials run)."""
        ...

    def tell(self, launch: Launch, trial: FrozenTrial | None) -> None:
        """`launch` ended: its trial where it completed, None where it failed."""
        ...


class OptunaSearch:
    """Optuna's samplers as a strategy: the study's enqueued trials (the baseline, the space's
    start points, a grid) first, then the sampler's picks, the aligned baseline as soon as the
    loop says it is due. A proposal storage already answers (a config measured or refused) is
    told from storage by the loop (SearchLoop.answer_known) and the sampler asked again."""

    sequential = False
    counts_repeats = False

    def __init__(self, loop: SearchLoop) -> None:
        self.loop, self.study = loop, loop.study
        self._known_in_row = 0

    def ask(self) -> Step:
        loop = self.loop
        room = loop.room()
        if room == StopReason.TIMEOUT:
            if not loop.in_flight:  # said once the running trials have ended
                loop.stop_line(f"--timeout {loop.timeout_s:.0f} s reached; stopping the "
                               "search.")
            return Stop(room)
        if room is not None:
            return Stop(room)
        while True:
            aligned = loop.align()
            if aligned is None and not self.study.get_trials(
                    deepcopy=False, states=(TrialState.WAITING,)) and loop.exhausted():
                loop.stop_line(f"Every config of search space '{loop.space.name}' "
                               f"({loop.space_size()}) is measured or refused; stopping the "
                               "search.")
                return Stop(StopReason.EXHAUSTED)
            trial = self._propose(aligned)
            config = loop.config_of(trial)
            role = Role(trial.user_attrs.get(TrialAttr.ROLE) or Role.SEARCH)
            if config.method == "none" and role != Role.ALIGNED_BASELINE:
                role = Role.BASELINE
            role = Role.SEARCH if role == Role.RETRY else role
            st.label_trial(trial, config, role.value)
            if not loop.answer_known(trial, config):
                self._known_in_row = 0
                return Launch(config, role, trial=trial)
            self._known_in_row += 1
            if self._known_in_row > MAX_KNOWN_IN_ROW:
                loop.stop_line("The sampler keeps proposing configs already measured or "
                               "refused: the space looks exhausted; stopping the search.")
                return Stop(StopReason.REPEATING)

    def _propose(self, aligned: TrialConfig | None) -> Any:
        """The sampler's next trial; the aligned baseline's own one where it is due: it runs
        next, not behind the queued grid points, so the ratios it splits are measured under the
        same conditions as the trials around it."""
        if aligned is None:
            return self.study.ask()
        return st.ask_fresh(self.study, user_attrs=st.aligned_attrs(aligned))

    def tell(self, launch: Launch, trial: FrozenTrial | None) -> None:
        return None  # the loop told the study; the sampler reads it from there
