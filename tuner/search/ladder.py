"""Search stage, campaigns: measure a fixed list of configs on a concurrency ladder, with repeats.

Used by the load-aware policy step. Runs are interleaved (baseline, A, B, ..., then the next
repeat) so slow drift of a shared machine hits every config alike. Each run is one engine
launch measured at every ladder level and is stored as a trial of a companion Optuna study
(`<study>.policy`) in the same storage, so a killed campaign resumes where it stopped and
reports regenerate from storage. A run that fails is recorded with its reason, never fatal;
a run's token capture stays in its folder, named in its attrs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tuner.records import EngineSpec, MeasureSettings, TrialAttr, TrialConfig, Workload
from tuner.search import study as st


def companion(study: Any) -> Any:
    import optuna

    return optuna.create_study(study_name=f"{study.study_name}.policy",
                               storage=study._storage, direction="maximize",
                               load_if_exists=True)


def measure(
    *, study: Any, engine: EngineSpec, workload: Workload, ladder: Sequence[int],
    runs: Sequence[tuple[str, TrialConfig]], repeats: int, phase: str, out_dir: Path,
    requests_per_slot: int = 4, say: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Measure each (role, config) `repeats` times on the ladder; returns every stored run of
    this phase as {role, label, key, repeat, config, result | failure}."""
    from optuna.trial import TrialState

    from tuner.measure import trial as runner

    comp = companion(study)
    settings = MeasureSettings(concurrencies=tuple(ladder), requests_per_slot=requests_per_slot)
    for t in comp.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        comp._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    done = {(t.user_attrs.get(TrialAttr.PHASE), t.user_attrs.get(TrialAttr.CONFIG_KEY), t.user_attrs.get(TrialAttr.REPEAT))
            for t in comp.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    total = len(runs) * repeats
    n = 0
    for rep in range(repeats):
        for role, config in runs:
            n += 1
            if (phase, config.key(), rep) in done:
                continue
            trial = comp.ask()
            for k, v in {TrialAttr.PHASE: phase, TrialAttr.ROLE: role,
                         TrialAttr.CONFIG_KEY: config.key(), TrialAttr.REPEAT: rep,
                         TrialAttr.LABEL: config.label(), "ladder": list(ladder),
                         TrialAttr.CONFIG: json.loads(config.model_dump_json())}.items():
                trial.set_user_attr(k, v)
            run_dir = out_dir / "policy" / f"run{trial.number}"
            outcome = runner.measure_outcome(engine, config, workload, settings, str(run_dir))
            if outcome.failure is not None:
                trial.set_user_attr(TrialAttr.FAILURE, outcome.failure.model_dump())
                comp.tell(trial, state=TrialState.FAIL)
                say(f"  [{phase} {n}/{total}] {config.label()}: FAIL "
                    f"({outcome.failure.kind}) {outcome.failure.reason[:200]}")
                continue
            result = outcome.result
            assert result is not None  # an outcome holds a result or a failure
            if outcome.tokens is not None:
                st.store_tokens(out_dir, trial, outcome.tokens, trial_dir=run_dir)
            trial.set_user_attr(TrialAttr.RESULT, json.loads(result.model_dump_json()))
            comp.tell(trial, result.levels[0].output_throughput)
            say(f"  [{phase} {n}/{total}] {config.label()}: " + " | ".join(
                f"c={lv.concurrency} {lv.output_throughput:.1f} tok/s" for lv in result.levels))
    return stored_runs(study, phase)


def stored_runs(study: Any, phase: str | None = None) -> list[dict[str, Any]]:
    import optuna
    from optuna.trial import TrialState

    try:
        comp = optuna.load_study(study_name=f"{study.study_name}.policy", storage=study._storage)
    except KeyError:
        return []
    out = []
    for t in comp.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if phase is not None and t.user_attrs.get(TrialAttr.PHASE) != phase:
            continue
        out.append({k: t.user_attrs.get(k) for k in ("phase", "role", "label", "key", "repeat",
                                                      "config", "result", "failure", "tokens")})
    return out
