"""Search stage, what the loop tells the study: a trial's outcome (its result with the
objective values and the SLO constraint, or its failure with reason, kind and log tail), a
proposal answered from storage, a trial opened fresh or labelled, and the FAIL of trials a
dead driver left RUNNING. Every write of a trial's attrs; tuner.search.study reads them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tuner.errors import TrialFailed
from tuner.records.configs import TrialConfig
from tuner.records.results import BenchResult
from tuner.records.storage import TrialAttr
from tuner.records.trials import Failure, Role
from tuner.search import study as st
from tuner.search.space import Point


def recover_orphans(study: Any) -> list[Point]:
    """Mark trials a dead driver left RUNNING as FAIL and return their points for a retry.

    Under the study folder's lock every RUNNING trial is a dead driver's; in a database shared
    by hosts only those whose heartbeat went stale are (tuner.search.storage.orphans)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    from tuner.search import optuna_compat
    from tuner.search import storage as store

    storage, retry = optuna_compat.storage_of(study), []
    for t in store.orphans(study):
        try:
            storage.set_trial_user_attr(optuna_compat.trial_id(t), TrialAttr.FAILURE, _failure_attr(
                Failure(reason="the driver stopped while this trial ran (killed or crashed); "
                        "retried", kind="driver_died")))
            storage.set_trial_state_values(optuna_compat.trial_id(t), TrialState.FAIL)
        except UpdateFinishedTrialError:
            continue  # another driver of the shared database failed it first and retries it
        if t.params:
            retry.append(Point.from_params(t.params))
    return retry


def _failure_attr(failure: Failure) -> dict[str, str]:
    """A Failure as a trial's FAILURE attr (its reason, kind and log tail)."""
    return {"reason": failure.reason, "kind": failure.kind, "log_tail": failure.log_tail}


def tell_known_failure(study: Any, trial: Any, original: Any) -> None:
    """Answer a proposal of a config the engine refused from storage: FAIL with the original's
    reason and kind, `duplicate_of` pointing at it, no launch (and none counted)."""
    import optuna

    failure = st.failure_of(original) or st.UNSTATED
    trial.set_user_attr(TrialAttr.FAILURE, _failure_attr(failure.model_copy(update={
        "log_tail": f"(not launched; see trial {original.number})"})))
    trial.set_user_attr(TrialAttr.DUPLICATE_OF, original.number)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def aligned_attrs(config: TrialConfig) -> dict[str, Any]:
    """A trial's attrs for the aligned baseline: no speculation on the same engine path as the
    speculative trials (e.g. no async scheduling, V1 runner), so speculation's own effect can
    be told from the engine-path change it forces."""
    return {TrialAttr.ROLE: Role.ALIGNED_BASELINE.value,
            TrialAttr.CONFIG_OVERRIDE: json.loads(config.model_dump_json())}


def ask_fresh(study: Any, *, user_attrs: dict[str, Any]) -> Any:
    """A new RUNNING trial that is not one of the study's WAITING ones: study.ask() hands out
    the oldest enqueued trial first (a grid point left when --n-trials ran out, say), which a
    re-measurement must not take."""
    import optuna

    from tuner.search import optuna_compat

    storage = optuna_compat.storage_of(study)
    trial_id = storage.create_new_trial(optuna_compat.study_id(study))
    for key, value in user_attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
    return optuna.trial.Trial(study, trial_id)


def values_of(result: BenchResult, objectives: list[str], concurrency: int) -> list[float]:
    level = result.level(concurrency)
    if level is None:
        raise ValueError(f"no level {concurrency} in result")
    vals = [float(getattr(level, o)) for o in objectives]
    if any(math.isnan(v) for v in vals):
        raise TrialFailed(f"c={concurrency}: an objective is undefined ({objectives} = {vals}); "
                          f"too few tokens per request?")
    return vals


def constraint_of(result: BenchResult, concurrency: int, constraints: dict[str, float | None]
                  ) -> list[float]:
    """Optuna's convention: a value <= 0 means the SLO is met."""
    level = result.level(concurrency)
    out = []
    for metric, limit in (("mean_tpot_ms", constraints.get("max_tpot_ms")),
                          ("p99_ttft_ms", constraints.get("max_ttft_ms"))):
        if limit is not None and level is not None:
            out.append(float(getattr(level, metric)) - float(limit))
    return out or [0.0]


def tell_result(study: Any, trial: Any, result: BenchResult, *, objectives: list[str],
                concurrency: int, constraints: dict[str, float | None],
                duplicate_of: int | None = None) -> list[float]:
    import optuna

    try:
        values = values_of(result, objectives, concurrency)
    except TrialFailed as e:
        tell_failure(study, trial, e)
        return []
    trial.set_user_attr(TrialAttr.RESULT, result_attr(result))
    trial.set_user_attr(TrialAttr.CONSTRAINT, constraint_of(result, concurrency, constraints))
    if duplicate_of is not None:
        trial.set_user_attr(TrialAttr.DUPLICATE_OF, duplicate_of)
    study.tell(trial, values, state=optuna.trial.TrialState.COMPLETE)
    return values


def result_attr(result: BenchResult) -> dict[str, Any]:
    """A BenchResult as a trial's RESULT attr: JSON, an undefined metric (NaN) written as null,
    as pydantic writes JSON (its python dump would keep the NaN)."""
    return json.loads(result.model_dump_json())


def tell_failure(study: Any, trial: Any, exc: TrialFailed) -> None:
    import optuna

    trial.set_user_attr(TrialAttr.FAILURE, _failure_attr(Failure(
        reason=str(exc), kind=exc.kind, log_tail=exc.log_tail[-4000:])))
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def label_trial(trial: Any, config: TrialConfig, role: str) -> None:
    """Store what a trial is: its config, label, config key and Role (as its plain value)."""
    trial.set_user_attr(TrialAttr.CONFIG, config.model_dump(mode="json"))
    trial.set_user_attr(TrialAttr.LABEL, config.label())
    trial.set_user_attr(TrialAttr.CONFIG_KEY, config.key())
    trial.set_user_attr(TrialAttr.ROLE, Role(role).value)
