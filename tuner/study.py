"""Study stage: the Optuna study is the single truth about trials.

Promises: storage in the study folder by default (a journal file, readable by
optuna-dashboard) or any Optuna RDB URL; every trial is written when it ends; a failed trial
is told as FAIL with its reason and log tail in user attrs; trials left RUNNING by a dead
driver are marked FAIL ("driver_died") and their configs retried; duplicate configs are
answered from storage; constraints (SLOs) are stored per trial for constrained samplers.
Nothing here starts an engine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, TrialFailed
from tuner.metrics import OBJECTIVES
from tuner.records import BenchResult, TrialConfig

SAMPLERS = ("tpe", "nsga2", "gp", "random", "grid")
ATTR = "tuner"  # study user attr holding the study's settings and fingerprint


def storage(out_dir: Path, url: str | None = None) -> Any:
    if url:
        if "://" not in url:
            raise ConfigError(f"--storage '{url}' is not an Optuna storage URL. Examples: "
                              f"sqlite:///study.db, postgresql://user@host/db; omit it to "
                              f"store in the study folder.")
        return url
    out_dir.mkdir(parents=True, exist_ok=True)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(out_dir / "study.journal")))


def open_existing(out_dir: Path, url: str | None = None, name: str | None = None) -> Any:
    """Load a study for reporting; the study folder alone is enough."""
    import optuna

    if url is None and not (out_dir / "study.journal").exists():
        raise ConfigError(f"No study in '{out_dir}' (no study.journal). Pass the folder that "
                          f"`tuner optimize` printed, e.g. outputs/instructcoder-smollm2.")
    st = storage(out_dir, url)
    names = optuna.get_all_study_names(st)
    if not names:
        raise ConfigError(f"The storage of '{out_dir}' holds no study yet.")
    if name is None:
        name = names[0]
    elif name not in names:
        raise ConfigError(f"No study named '{name}' in the storage. Available: {', '.join(names)}.")
    return optuna.load_study(study_name=name, storage=st)


def validate_objectives(names: list[str]) -> list[str]:
    for n in names:
        if n not in OBJECTIVES:
            raise ConfigError(f"Unknown objective '{n}'. Available: {', '.join(OBJECTIVES)}. "
                              f"Example: --objectives output_throughput,mean_tpot_ms.")
    if len(set(names)) != len(names) or not names:
        raise ConfigError(f"--objectives must list distinct names, got {names}.")
    return names


def quiet_optuna() -> None:
    """Our own one line per trial replaces Optuna's INFO lines and experimental warnings."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def make_sampler(name: str, *, seed: int | None, constrained: bool) -> Any:
    import optuna

    quiet_optuna()
    cons = _constraints if constrained else None
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                          constraints_func=cons, n_startup_trials=5)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, constraints_func=cons, population_size=8)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, constraints_func=cons)
    if name in ("random", "grid"):  # grid: every point is enqueued by the driver
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"Unknown sampler '{name}'. Available: {', '.join(SAMPLERS)}.")


def _constraints(trial: Any) -> list[float]:
    return list(trial.user_attrs.get("constraint", [0.0]))


def create(
    *, out_dir: Path, name: str, objectives: list[str], sampler: Any,
    storage_url: str | None, settings: dict[str, Any],
) -> Any:
    """Create the study or load it to resume; refuse to resume with different settings."""
    import optuna

    directions = [OBJECTIVES[o][0] for o in objectives]
    study = optuna.create_study(study_name=name, storage=storage(out_dir, storage_url),
                                directions=directions, sampler=sampler, load_if_exists=True)
    old = study.user_attrs.get(ATTR)
    if old is None:
        study.set_user_attr(ATTR, settings)
    else:
        for key in ("objectives", "workload_digest", "target_concurrency"):
            if old.get(key) != settings.get(key):
                raise ConfigError(
                    f"Study '{name}' in {out_dir} was started with {key}={old.get(key)!r}, this "
                    f"command asks for {settings.get(key)!r}. Resume with the same options, or "
                    f"pass --study-name NEW (or another --output-dir) to start a new study.")
        merged = {**old, "constraints": settings.get("constraints"),
                  "settings": settings.get("settings")}
        study.set_user_attr(ATTR, merged)
    return study


def recover_orphans(study: Any) -> list[dict[str, Any]]:
    """Mark trials a dead driver left RUNNING as FAIL and return their params for a retry."""
    from optuna.trial import TrialState

    retry = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        if t.state == TrialState.WAITING:
            continue
        study._storage.set_trial_user_attr(t._trial_id, "failure", {
            "reason": "the driver stopped while this trial ran (killed or crashed); retried",
            "kind": "driver_died", "log_tail": ""})
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        if t.params:
            retry.append(dict(t.params))
    return retry


def completed(study: Any) -> dict[str, Any]:
    """Completed, non-repeat trials by config key: duplicates are answered from these."""
    from optuna.trial import TrialState

    out = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = t.user_attrs.get("key")
        if key and t.user_attrs.get("role") != "repeat" and key not in out:
            out[key] = t
    return out


def counted_trials(study: Any) -> int:
    """Trials that count toward --n-trials: finished ones, minus retried and repeat trials."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if t.user_attrs.get("role") == "repeat" or "duplicate_of" in t.user_attrs:
            continue  # repeats and configs answered from storage cost no engine launch
        if t.user_attrs.get("failure", {}).get("kind") == "driver_died":
            continue
        n += 1
    return n


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
    trial.set_user_attr("result", json.loads(result.model_dump_json()))
    trial.set_user_attr("constraint", constraint_of(result, concurrency, constraints))
    if duplicate_of is not None:
        trial.set_user_attr("duplicate_of", duplicate_of)
    study.tell(trial, values, state=optuna.trial.TrialState.COMPLETE)
    return values


def tell_failure(study: Any, trial: Any, exc: TrialFailed) -> None:
    import optuna

    trial.set_user_attr("failure", {"reason": str(exc), "kind": exc.kind,
                                    "log_tail": exc.log_tail[-4000:]})
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def label_trial(trial: Any, config: TrialConfig, role: str) -> None:
    trial.set_user_attr("config", json.loads(config.model_dump_json()))
    trial.set_user_attr("label", config.label())
    trial.set_user_attr("key", config.key())
    trial.set_user_attr("role", role)
