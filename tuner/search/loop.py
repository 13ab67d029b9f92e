"""Search stage, the loop: ask/tell in the driver, trials on an executor (inline or Ray).

Promises: the baseline is measured first in every study; every trial is told to the storage
as it ends (a result, or a FAIL with its reason and log tail), a result with the token
capture its executor brought back, saved in the trial's folder; what storage already knows is
never launched again (a measured config is answered with its result, a config the same engine
refused at start with its failure); one line per finished trial through `say`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from tuner.errors import ConfigError, TrialFailed
from tuner.records import (
    BenchResult,
    EngineSpec,
    MeasureSettings,
    Role,
    TrialAttr,
    TrialConfig,
    TrialOutcome,
    Workload,
)
from tuner.search import study as st
from tuner.search.space import SearchSpace


def enqueue_start(study, sp, sampler: str, retry: list[dict]) -> None:
    trials = study.get_trials(deepcopy=False)
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    has_baseline = any(t.state in (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
                       and st.is_baseline(t) for t in trials)
    if not has_baseline:
        # An override, not a sampled value: "none" is no choice of the sampled method, so the
        # sampler is never steered back to this measured point (tuner.search.space suggest).
        study.enqueue_trial({}, user_attrs={TrialAttr.ROLE: Role.BASELINE.value, TrialAttr.CONFIG_OVERRIDE: json.loads(
            sp.baseline().model_dump_json())})
    for params in retry:
        if params.get("method") != "none":  # a baseline is enqueued above when it is missing
            study.enqueue_trial(params, user_attrs={TrialAttr.ROLE: Role.RETRY.value})
    if trials and waiting:
        return
    if not trials:
        for point in sp.start_points:
            params = sp.params_of(point)
            if params:
                study.enqueue_trial(params, user_attrs={TrialAttr.ROLE: Role.START_POINT.value})
        if sampler == "grid":
            for params in sp.grid():
                study.enqueue_trial(params, user_attrs={TrialAttr.ROLE: Role.SEARCH.value})


def enqueue_aligned_baseline(study: Any, config: TrialConfig) -> None:
    """Queue the aligned baseline once: no speculation on the same engine path as the
    speculative trials (e.g. no async scheduling, V1 runner), so speculation's own effect can
    be told from the engine-path change it forces."""
    if any(t.user_attrs.get(TrialAttr.ROLE) == Role.ALIGNED_BASELINE for t in study.get_trials(deepcopy=False)
           if t.state.is_finished() or t.state == TrialState.WAITING):
        return
    study.enqueue_trial({}, user_attrs={TrialAttr.ROLE: Role.ALIGNED_BASELINE.value,
                                         TrialAttr.CONFIG_OVERRIDE: json.loads(
                                             config.model_dump_json())})


class SearchLoop:
    """Ask/tell in the driver; trials run on the executor (inline or Ray).

    What storage already knows is never launched again: a config measured before is answered
    with its result, a config the same engine refused at start with its failure (study.py
    `rejected`); neither counts toward --n-trials.
    """

    def __init__(self, *, study: Any, space: SearchSpace, engine: EngineSpec, workload: Workload,
                 settings: MeasureSettings, out_dir: Path, objectives: list[str], target: int,
                 constraints: dict[str, float | None], executor: Any, gpus: float,
                 say: Callable[[str], None], line: Callable[[BenchResult, dict | None], str],
                 rates: list[float] | None = None) -> None:
        self.study, self.space, self.engine, self.workload = study, space, engine, workload
        self.settings, self.out_dir, self.objectives, self.target = settings, out_dir, \
            objectives, target
        self.constraints, self.executor, self.gpus, self.rates = constraints, executor, gpus, rates
        self.say, self.line = say, line
        self.launched = 0
        self.engine_digest = st.engine_digest(engine)
        self.method_choices = st.method_choices(study)
        self._space_keys: frozenset | None = None  # config keys of a finite space
        # The [N] of a finished trial's line: trials toward --n-trials (the replay strategy
        # counts engine launches instead, repeats included).
        self.ordinal: Callable[[], int] = lambda: st.counted_trials(self.study) + 1

    def suggest(self, trial) -> TrialConfig:
        return self.space.suggest(trial, method_choices=self.method_choices
                                  ).with_acceptance_profile(self.rates)

    def config_of(self, trial) -> TrialConfig:
        """The enqueued override (baseline, aligned baseline, repeat) or the sampler's pick."""
        override = trial.user_attrs.get(TrialAttr.CONFIG_OVERRIDE)
        return TrialConfig.model_validate(override) if override else self.suggest(trial)

    def _baseline(self):
        for t in st.completed(self.study).values():
            if st.is_baseline(t):
                return t.user_attrs.get(TrialAttr.RESULT)
        return None

    def run(self, *, n_trials: int, timeout_s: float | None) -> None:
        t0 = time.monotonic()
        in_flight: dict[int, tuple] = {}
        duplicates_in_row = 0
        while True:
            budget = n_trials - st.counted_trials(self.study) - len(in_flight)
            timed_out = timeout_s is not None and time.monotonic() - t0 > timeout_s
            while budget > 0 and not timed_out and len(in_flight) < self.executor.parallel:
                if not self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) \
                        and self._exhausted():
                    self.say(f"Every config of search space '{self.space.name}' "
                             f"({len(self._space_keys or ())}) is measured or refused; "
                             f"stopping the search.")
                    break
                trial = self.study.ask()
                config = self.config_of(trial)
                role = trial.user_attrs.get(TrialAttr.ROLE) or Role.SEARCH
                if config.method == "none" and role != Role.ALIGNED_BASELINE:
                    role = Role.BASELINE
                st.label_trial(trial, config, Role.SEARCH if role == Role.RETRY else role)
                if self._answer_known(trial, config):
                    duplicates_in_row += 1
                    if duplicates_in_row > 25:
                        self.say("The sampler keeps proposing configs already measured or "
                                 "refused: the space looks exhausted; stopping the search.")
                        budget = 0
                    continue
                duplicates_in_row = 0
                self._submit(trial, config)
                in_flight[trial.number] = (trial, config, time.monotonic())
                self.launched += 1
                budget -= 1
                if self.executor.parallel == 1:
                    break
            if not in_flight:
                if timed_out:
                    self.say(f"--timeout {timeout_s:.0f} s reached; stopping the search.")
                return
            number, outcome = self.executor.wait_one()
            trial, config, started = in_flight.pop(number)
            self._tell(trial, config, outcome, time.monotonic() - started)

    def _exhausted(self) -> bool:
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
        self.executor.submit(trial.number, self.engine, config, self.workload, self.settings,
                             str(self.out_dir / "trials" / str(trial.number)),
                             num_gpus=self.gpus)

    def _answer_known(self, trial, config: TrialConfig) -> bool:
        """Tell `trial` from storage when its config was measured or refused; True if told."""
        dup = st.completed(self.study).get(config.key())
        if dup is not None:
            self._answer_duplicate(trial, dup)
            return True
        refused = st.rejected(self.study, engine=self.engine_digest).get(config.key())
        if refused is None:
            return False
        st.tell_known_failure(self.study, trial, refused)
        kind = refused.user_attrs[TrialAttr.FAILURE].get("kind")
        self.say(f"trial {trial.number} {config.label()}: the engine refused this config in "
                 f"trial {refused.number} ({kind}); answered from storage as FAIL (no engine "
                 f"launched; a new --study-name would launch it again)")
        return True

    def _tell(self, trial, config, outcome: TrialOutcome, wall_s: float) -> None:
        trial.set_user_attr(TrialAttr.WALL_S, round(wall_s, 1))
        for key in ("cuda_visible_devices", "host", "ran_from", "ran_to"):
            if getattr(outcome, key) is not None:
                trial.set_user_attr(key, getattr(outcome, key))
        total = self.ordinal()
        if outcome.failure is not None:
            f = outcome.failure
            exc = TrialFailed(f.reason, log_tail=f.log_tail)
            exc.kind = f.kind
            st.tell_failure(self.study, trial, exc)
            self.say(f"[{total}] trial {trial.number} {config.label()}: FAIL ({exc.kind}) "
                     f"{f.reason[:300]} -- recorded; the study continues. Log: "
                     f"{self.out_dir / 'trials' / str(trial.number) / 'engine.log'}")
            return
        assert outcome.result is not None  # an outcome holds a result or a failure
        if outcome.tokens is not None and not st.store_tokens(
                self.out_dir, trial, outcome.tokens,
                trial_dir=self.out_dir / "trials" / str(trial.number)):
            self.say(f"trial {trial.number}: its token capture came back unreadable; stored "
                     f"without it, so replay is unavailable for this trial")
        st.tell_result(self.study, trial, outcome.result, objectives=self.objectives,
                       concurrency=self.target, constraints=self.constraints)
        self.say(f"[{total}] trial {trial.number} " + self.line(outcome.result, self._baseline()))

    def _answer_duplicate(self, trial, dup) -> None:
        result = BenchResult.model_validate(dup.user_attrs[TrialAttr.RESULT])
        st.tell_result(self.study, trial, result, objectives=self.objectives,
                       concurrency=self.target, constraints=self.constraints,
                       duplicate_of=dup.number)
        self.say(f"trial {trial.number} {result.config.label()}: same config as trial "
                 f"{dup.number}, answered from storage (no engine launched)")

    def repeat_leaders(self, *, repeats: int, leaders: int = 3) -> None:
        """Re-measure the baseline and the leading configs so ranking can use their spread."""
        trials = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                  if t.user_attrs.get(TrialAttr.DUPLICATE_OF) is None and t.user_attrs.get(TrialAttr.CONFIG)]
        originals = [t for t in trials if t.user_attrs.get(TrialAttr.ROLE) != Role.REPEAT]
        spec = sorted((t for t in originals if t.user_attrs[TrialAttr.CONFIG].get("speculative_config")),
                      key=lambda t: -_level_of(t, self.target, "output_throughput"))[:leaders]
        base = [t for t in originals if st.is_baseline(t)][:1]
        for t in base + spec:
            have = sum(1 for r in trials if r.user_attrs.get(TrialAttr.REPEAT_OF) == t.number)
            for _ in range(repeats - 1 - have):
                # The stored config itself, on a trial of its own: study.ask() would hand out a
                # WAITING grid point instead, and a re-sampled config might not be this one.
                trial = st.ask_fresh(self.study, user_attrs={
                    TrialAttr.ROLE: Role.REPEAT.value, TrialAttr.REPEAT_OF: t.number,
                    TrialAttr.CONFIG_OVERRIDE: t.user_attrs[TrialAttr.CONFIG]})
                config = self.config_of(trial)
                st.label_trial(trial, config, Role.REPEAT)
                self.say(f"repeat of trial {t.number} ({config.label()})")
                started = time.monotonic()
                self._submit(trial, config)
                _, outcome = self.executor.wait_one()
                self._tell(trial, config, outcome, time.monotonic() - started)


def _level_of(trial, c: int, metric: str) -> float:
    for lv in trial.user_attrs.get(TrialAttr.RESULT, {}).get("levels", []):
        if lv["concurrency"] == c:
            return float(lv[metric])
    return float("nan")
