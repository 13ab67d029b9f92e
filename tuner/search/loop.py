"""Search stage, the loop: it asks a strategy (tuner.search.strategy) which config next, or
whether to stop, handing it a StudyView to read, launches its picks as trials on an executor
(inline or Ray) and tells it their outcomes. It is the one launch path: the search and the
repeats after it (--repeats) both run through it.

Promises: the baseline is measured first in every study; every trial is told to the storage
as it ends (a result, or a FAIL with its reason and log tail), a result with the token
capture its executor brought back, saved in the trial's folder; what storage already knows is
never launched again (a measured config is answered with its result, a config the same engine
refused at start with its failure), and a proposal whose config is in flight waits for it and
is answered from storage; one event per finished trial through `record` (tuner.outputs
words it: "[done/total]" with its wall time), one as each engine starts (and, inline, a line
as it is ready), and the running count handed to `tick` for a progress bar. An aligned
baseline (no speculation on the speculative engine path) is launched at most once per study,
right after what calls for it: the first speculative trial whose engine path differs from the
plain baseline's ("auto"), or the plain baseline (one given by the user).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.errors import ConfigError, TrialFailed
from tuner.records import decisions as ev
from tuner.records.configs import RequestSchedule, TrialConfig, Workload
from tuner.records.options import OptimizePlan
from tuner.records.storage import TrialAttr
from tuner.records.trials import Role, TrialOutcome
from tuner.search import optuna_compat, outcomes
from tuner.search import study as st
from tuner.search.space import Point, SearchSpace
from tuner.search.strategy import (
    Launch,
    OptunaSearch,
    Repeats,
    Step,
    Stop,
    StopReason,
    Strategy,
    StudyView,
)
from tuner.search.trials import aligned_gap, has_aligned_baseline, path_alignment

# Proposals in a row that storage already answers before the sampler counts as stuck.
MAX_KNOWN_IN_ROW = 25


def enqueue_start(study, sp, sampler: str, retry: list[Point]) -> None:
    trials = study.get_trials(deepcopy=False)
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    has_baseline = any(t.state in (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
                       and st.is_baseline(t) for t in trials)
    if not has_baseline:
        # An override, not a sampled value: "none" is no choice of the sampled method, so the
        # sampler is never steered back to this measured point (tuner.search.space suggest).
        study.enqueue_trial({}, user_attrs={TrialAttr.ROLE: Role.BASELINE.value, TrialAttr.CONFIG_OVERRIDE: json.loads(
            sp.baseline().model_dump_json())})
    for point in retry:
        if point.method != "none":  # a baseline is enqueued above when it is missing
            study.enqueue_trial(point.params(), user_attrs={TrialAttr.ROLE: Role.RETRY.value})
    if trials and waiting:
        return
    if not trials:
        for point in sp.start_points:
            params = sp.params_of(point)
            if params is not None:
                study.enqueue_trial(params.params(),
                                    user_attrs={TrialAttr.ROLE: Role.START_POINT.value})
        if sampler == "grid":
            for params in sp.grid():
                study.enqueue_trial(params.params(),
                                    user_attrs={TrialAttr.ROLE: Role.SEARCH.value})


def _quiet(*_args: Any) -> None:
    return None


def _untold(_event: ev.Event, *, store: bool = True, show: bool = True) -> None:
    return None


@dataclass(frozen=True)
class LoopOutput:
    """What the loop tells, and through what: `record(event, store=True, show=True)` each event
    of the search (tuner.records.decisions: a trial ended, a decision and its figures), which
    tuner.outputs.decisions Narrator words, prints and keeps for the report's "How it was
    decided"; `detail` the lines -v adds that an inline trial says itself (its engine start
    and levels); `say` and `note(topic, text, key="")` what outputs worded itself, handed on
    to the strategies' callers (tuner.api); `tick(done, total)` the progress bar; `show_bar`
    a bar over each level's requests, for an inline trial. None: not told."""

    record: Callable[..., None] = _untold
    say: Callable[[str], None] = _quiet
    detail: Callable[[str], None] | None = None
    note: Callable[..., None] | None = None
    tick: Callable[[int, int], None] | None = None
    show_bar: bool = False


class SearchLoop:
    """The driver: a strategy's picks run as trials on the executor (inline or Ray).

    What storage already knows is never launched again: a config measured before is answered
    with its result, a config the same engine refused at start with its failure (study.py
    `rejected`); neither counts toward --n-trials.
    """

    def __init__(self, *, plan: OptimizePlan, study: Any, space: SearchSpace,
                 workload: Workload, executor: Any, gpus: float,
                 schedule: RequestSchedule | None = None,
                 output: LoopOutput | None = None) -> None:
        """`plan` as tuner.api resolved it (tuner.checks.optimize_options): the engine, the
        target level the objectives are read at, the aligned baseline, and the options (the
        levels, the SLOs, the acceptance profile); `gpus`: what each trial holds on the
        executor; `schedule`: what every launch sends (None: each trial builds it from the
        workload and the settings, tuner.measure.request_schedule, as the study's own was
        built)."""
        options = plan.options
        self.study, self.space, self.engine, self.workload = study, space, plan.engine, \
            workload
        self.settings, self.out_dir, self.objectives = options.settings, plan.out_dir, \
            list(options.objectives)
        self.target = plan.target_concurrency
        self.constraints, self.rates = dict(options.constraints), options.acceptance_rates
        self.executor, self.gpus = executor, gpus
        self.schedule = schedule
        output = output or LoopOutput()
        self.record, self.say, self.show_bar = output.record, output.say, output.show_bar
        self.detail = output.detail or _quiet
        self.note = output.note or _quiet
        self.tick = output.tick or _quiet
        self.engine_digest = st.engine_digest(self.engine)
        self.method_choices = st.method_choices(study)
        self._space_keys: frozenset | None = None  # config keys of a finite space
        # --aligned-baseline: "auto" compares engine paths once the first speculative trial
        # ends; a TrialConfig is launched once the plain baseline is measured (align()).
        self.aligned, self._aligned_decided = plan.aligned_baseline, False
        self._check_landed = False  # an auto-aligned baseline's own path is still to check
        # The [N/total] of a finished trial's line: trials toward --n-trials (the replay
        # strategy counts engine launches instead, repeats included), plus `extra`, the
        # repeats that --repeats launches after the search.
        self._counts_repeats = False  # budget(): whether repeats count toward --n-trials
        self.total = 0
        self.extra = 0
        # The budget run() holds its strategy to (room): trials or launches, seconds, when it
        # began, and the launches in flight.
        self.n_trials, self.timeout_s, self._t0, self.in_flight = 0, None, 0.0, 0

    def requests_per_launch(self) -> int:
        """Requests every launch sends, warm-ups included (the schedule's, or as it builds)."""
        if self.schedule is not None:
            return self.schedule.requests
        return self.settings.level_requests(self.workload.spec.num_prompts) + \
            self.settings.sample_prompts

    def done(self) -> int:
        """Trials toward --n-trials: completed and failed ones, repeats too where the running
        strategy counts them (budget)."""
        return st.counted_trials(self.study, repeats=self._counts_repeats)

    def budget(self, n_trials: int, *, counts_repeats: bool) -> None:
        """The budget a strategy runs under: the bar's total, and whether repeats count toward
        it (the replay strategy's --n-trials counts every engine launch)."""
        self.total, self._counts_repeats = n_trials, counts_repeats
        self.progress()

    def ordinal(self) -> int:
        return self.done() + self.extra + 1

    def progress(self) -> None:
        self.tick(self.done() + self.extra, self.total)

    def align(self) -> TrialConfig | None:
        """The aligned baseline to launch now, decided once per study (a resumed study that
        has one never launches another): a given one as soon as the plain baseline is
        measured; with "auto", after the first speculative trial, the one that puts a
        no-speculation engine on that trial's path, where it differs from the plain
        baseline's. None otherwise."""
        if self.aligned == "off":
            return None
        if self._check_landed and not any(st.stored(t).role == Role.ALIGNED_BASELINE
                                          for t in self.study.get_trials(
                                              deepcopy=False, states=(TrialState.RUNNING,))):
            self._check_landed = False  # the one this driver launched has ended
            gap = aligned_gap(self.study)
            if gap is not None:
                self.record(ev.PathGap(aligned_trial=gap[0].number, trial=gap[1].number,
                                     difference=gap[2].describe()))
        if self._aligned_decided:
            return None
        if has_aligned_baseline(self.study):
            self._aligned_decided = True
            return None
        if isinstance(self.aligned, TrialConfig):
            if not any(st.is_baseline(t) for t in st.completed(self.study).values()):
                return None  # the plain baseline is measured first in every study
            self._aligned_decided = True
            return self.aligned
        found = path_alignment(self.study)
        if found is None:
            return None  # no speculative trial (or no baseline) measured yet
        self._aligned_decided = True
        spec, alignment = found
        label = st.stored(spec).label or f"trial {spec.number}"
        if alignment is None:
            self.record(ev.PathSame(trial=spec.number, label=label))
            return None
        config = alignment.trial_config()
        self._check_landed = True
        self.record(ev.PathLeft(trial=spec.number, label=label, difference=alignment.describe(),
                              knobs=(*alignment.engine_args, *(
                                  f"{k}={v}" for k, v in sorted(alignment.engine_env.items())))))
        return config

    def suggest(self, trial) -> TrialConfig:
        return self.space.suggest(trial, method_choices=self.method_choices
                                  ).with_acceptance_profile(self.rates)

    def config_of(self, trial) -> TrialConfig:
        """The enqueued override (baseline, aligned baseline, repeat) or the sampler's pick."""
        return st.stored(trial).override or self.suggest(trial)

    def _baseline(self):
        for t in st.completed(self.study).values():
            if st.is_baseline(t):
                return st.result_json(t)
        return None

    def run(self, strategy: Strategy | None = None, *, n_trials: int,
            timeout_s: float | None) -> Stop:
        """Ask `strategy` (default: Optuna's samplers, OptunaSearch) for its next step, launch
        it, store its outcome and tell the strategy, until it stops with no trial in flight;
        how it stopped. --n-trials and --timeout are the budget its `room` reads."""
        strategy = OptunaSearch() if strategy is None else strategy
        # A study the replay strategy began keeps counting every launch if Optuna takes over.
        self.budget(n_trials, counts_repeats=self._counts_repeats or strategy.counts_repeats)
        self.n_trials, self.timeout_s, self._t0 = n_trials, timeout_s, time.monotonic()
        return self._drive(strategy)

    def view(self) -> StudyView:
        """What a strategy sees when it is asked (tuner.search.strategy StudyView)."""
        return StudyView(
            study=self.study, space=self.space, target=self.target, settings=self.settings,
            workload=self.workload, engine=self.engine, n_trials=self.n_trials,
            timeout_s=self.timeout_s, in_flight=self.in_flight,
            requests_per_launch=self.requests_per_launch(), room=self.room, align=self.align,
            exhausted=self.exhausted, space_size=self.space_size, config_of=self.config_of,
            record=self.record)

    def _drive(self, strategy: Strategy, *, extra: bool = False) -> Stop:
        """The one launch path: ask, open the trial, answer a proposal storage knows or launch
        it, wait for an outcome, store it and tell the strategy, until it stops with nothing
        in flight. A proposal whose config is in flight waits for it and is answered from
        storage then (a twin is never launched beside it). `extra`: launches outside
        --n-trials (the repeats after the search)."""
        running: dict[int, tuple[Launch, Any, float]] = {}
        held: list[tuple[Launch, Any]] = []  # proposals whose twin is in flight
        width = 1 if strategy.sequential else self.executor.parallel
        known_in_row = 0
        while True:
            step: Step | None = None
            while len(running) < width and not held:
                step = strategy.ask(self.view())
                if isinstance(step, Stop):
                    break
                trial = self._open(step)
                if step.trial is not None and self._in_flight(running, step):
                    held.append((step, trial))
                elif step.trial is not None and self.answer_known(trial, step.config):
                    known_in_row += 1
                    if known_in_row > MAX_KNOWN_IN_ROW:
                        self.record(ev.SamplerRepeating())
                        step = Stop(StopReason.REPEATING)
                        break
                else:
                    known_in_row = 0
                    self._start(running, step, trial)
            if not running:
                assert isinstance(step, Stop)  # a strategy asked with nothing running stops
                return step
            number, outcome = self.executor.wait_one()
            launch, trial, started = running.pop(number)
            self.in_flight = len(running)
            self._tell(trial, launch.config, outcome, time.monotonic() - started, extra=extra)
            strategy.tell(launch, self._finished(trial))
            held = self._release(held, running)

    def _start(self, running: dict[int, tuple[Launch, Any, float]], launch: Launch,
               trial: Any) -> None:
        """Submit `trial` to the executor, counted in flight."""
        # Started before the submit: an inline executor runs the whole trial in it.
        running[trial.number] = (launch, trial, time.monotonic())
        self.in_flight = len(running)
        self._submit(trial, launch.config)

    def _release(self, held: list[tuple[Launch, Any]],
                 running: dict[int, tuple[Launch, Any, float]]) -> list[tuple[Launch, Any]]:
        """The held proposals whose twin has ended are answered from storage, or launched
        where it failed and storage knows nothing; those still waiting for theirs."""
        waiting = []
        for launch, trial in held:
            if self._in_flight(running, launch):
                waiting.append((launch, trial))
            elif not self.answer_known(trial, launch.config):
                self._start(running, launch, trial)
        return waiting

    @staticmethod
    def _in_flight(running: dict[int, tuple[Launch, Any, float]], launch: Launch) -> bool:
        """Whether a trial of `launch`'s config is running."""
        return launch.config.key() in {other.config.key() for other, _, _ in running.values()}

    def room(self) -> StopReason | None:
        """None while --n-trials and --timeout leave room for one more launch (the trials in
        flight counted), else which of them ran out."""
        if self.timeout_s is not None and time.monotonic() - self._t0 > self.timeout_s:
            return StopReason.TIMEOUT
        if self.n_trials - self.done() - self.in_flight <= 0:
            return StopReason.BUDGET
        return None

    def _open(self, launch: Launch) -> Any:
        """The trial `launch` runs as: the one its sampler proposed, else a fresh one with
        its config as the override (a repeat names the trial it repeats), labelled (before
        storage is asked about it: a told trial takes no more attributes)."""
        if launch.trial is not None:
            trial = launch.trial
        elif launch.role == Role.ALIGNED_BASELINE:
            trial = outcomes.ask_fresh(self.study, user_attrs=outcomes.aligned_attrs(launch.config))
        else:
            attrs = {TrialAttr.ROLE: launch.role.value,
                     TrialAttr.CONFIG_OVERRIDE: launch.config.model_dump(mode="json")}
            if launch.repeat_of is not None:
                attrs[TrialAttr.REPEAT_OF] = launch.repeat_of
            trial = outcomes.ask_fresh(self.study, user_attrs=attrs)
        outcomes.label_trial(trial, launch.config, launch.role.value)
        return trial

    def _finished(self, trial: Any) -> FrozenTrial | None:
        """The stored trial where it completed, else None."""
        frozen = optuna_compat.storage_of(self.study).get_trial(optuna_compat.trial_id(trial))
        return frozen if frozen.state == TrialState.COMPLETE else None

    def space_size(self) -> int:
        """How many configs the finite space holds (0 before `exhausted` listed them)."""
        return len(self._space_keys or ())

    def exhausted(self) -> bool:
        """A finite space whose every config is measured or refused: the sampler could only
        propose known points, each one more trial answered from storage."""
        if self._space_keys is None:
            try:
                self._space_keys = frozenset(
                    self.space.config_from_params(p).with_acceptance_profile(self.rates).key()
                    for p in self.space.grid(limit=10_000))
            except ConfigError:  # continuous or too large to list: never exhausted
                self._space_keys = frozenset({None})
        known = set(st.completed(self.study)) | set(
            st.rejected(self.study, engine=self.engine_digest))
        return self._space_keys <= known

    def _submit(self, trial, config: TrialConfig) -> None:
        trial.set_user_attr(st.ENGINE_ATTR, self.engine_digest)
        trial_dir = self.out_dir / "trials" / str(trial.number)
        args = (trial.number, self.engine, config, self.workload, self.settings, str(trial_dir))
        schedule = self._schedule_for(config)
        if getattr(self.executor, "reports_progress", False):
            # Inline, the trial itself says when its engine starts, is ready, and each level.
            self.executor.submit(*args, num_gpus=self.gpus, schedule=schedule,
                                 progress=lambda m: self.detail(f"  trial {trial.number}: {m}"),
                                 show_bar=self.show_bar)
        else:
            # A Ray worker's lines never reach this terminal: say here what it is doing.
            self.record(ev.EngineStarting(trial=trial.number, label=config.label(),
                                        log=str(trial_dir / "engine.log")))
            self.executor.submit(*args, num_gpus=self.gpus, schedule=schedule)

    def _schedule_for(self, config: TrialConfig) -> RequestSchedule | None:
        """The study's schedule as `config`'s launch sends it: the workload sample
        (RequestSchedule.sample) only with the plain baseline, until one has completed."""
        schedule = self.schedule
        if schedule is None or not schedule.sample:
            return schedule
        if config.key() == self.space.baseline().key() and not any(
                st.is_baseline(t) for t in self.study.get_trials(
                    deepcopy=False, states=(TrialState.COMPLETE,))):
            return schedule
        return schedule.without_sample()

    def answer_known(self, trial, config: TrialConfig) -> bool:
        """Tell `trial` from storage when its config was measured or refused; True if told."""
        dup = st.completed(self.study).get(config.key())
        if dup is not None:
            self._answer_duplicate(trial, dup)
            return True
        refused = st.rejected(self.study, engine=self.engine_digest).get(config.key())
        if refused is None:
            return False
        outcomes.tell_known_failure(self.study, trial, refused)
        self.record(ev.RefusedBefore(trial=trial.number, label=config.label(),
                                   refused_trial=refused.number,
                                   failure_kind=st.stored(refused).failure_kind))
        return True

    def _tell(self, trial, config, outcome: TrialOutcome, wall_s: float, *,
              extra: bool = False) -> None:
        """Store the outcome and say its line; `extra`: a launch outside --n-trials."""
        trial.set_user_attr(TrialAttr.WALL_S, round(wall_s, 1))
        for key in ("cuda_visible_devices", "host", "ran_from", "ran_to"):
            if getattr(outcome, key) is not None:
                trial.set_user_attr(key, getattr(outcome, key))
        done, total = self.ordinal(), max(self.total, self.ordinal())
        self.extra += extra
        if outcome.failure is not None:
            f = outcome.failure
            exc = TrialFailed(f.reason, log_tail=f.log_tail)
            exc.kind = f.kind
            outcomes.tell_failure(self.study, trial, exc)
            self.record(ev.TrialFailedEvent(
                done=done, total=total, trial=trial.number, label=config.label(),
                failure_kind=str(exc.kind), reason=f.reason, wall_s=wall_s,
                log=str(self.out_dir / "trials" / str(trial.number) / "engine.log")))
            self.progress()
            return
        assert outcome.result is not None  # an outcome holds a result or a failure
        if outcome.tokens is not None and not st.store_tokens(
                self.out_dir, trial, outcome.tokens,
                trial_dir=self.out_dir / "trials" / str(trial.number)):
            self.record(ev.TokensUnreadable(trial=trial.number))
        outcomes.tell_result(self.study, trial, outcome.result, objectives=self.objectives,
                       concurrency=self.target, constraints=self.constraints)
        self.record(ev.TrialEnded(done=done, total=total, trial=trial.number,
                                result=outcome.result, baseline=self._baseline(), wall_s=wall_s))
        self.progress()

    def _answer_duplicate(self, trial, dup) -> None:
        result = st.stored(dup).result
        assert result is not None  # st.completed: trials with a result
        outcomes.tell_result(self.study, trial, result, objectives=self.objectives,
                       concurrency=self.target, constraints=self.constraints,
                       duplicate_of=dup.number)
        self.record(ev.SameConfig(trial=trial.number, label=result.config.label(),
                                duplicate_of=dup.number))

    def repeat_leaders(self, *, repeats: int, leaders: int = 3) -> Stop:
        """Re-measure the baseline and the leading configs so ranking can use their spread
        (tuner.search.strategy Repeats), outside --n-trials; how it stopped."""
        repeat = Repeats.of_leaders(self.study, target=self.target, repeats=repeats,
                                    leaders=leaders)
        # The bar's total becomes what will really run: the search as it ended, these repeats.
        self.total = self.done() + self.extra + len(repeat.launches)
        self.progress()
        return self._drive(repeat, extra=True)
