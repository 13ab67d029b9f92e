"""Search stage, the stored trials as the search reads them: the measured trials the
predictor takes (tuner.replay.predict MeasuredTrial), the study's aligned baseline and the
engine paths its trials ran (tuner.measure.enginepath).

Promises: only completed trials with a result count, never an answer from storage (a
duplicate); a repeat carries the role of the trial it repeats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from tuner.measure import enginepath
from tuner.records.configs import TrialConfig
from tuner.records.results import BenchResult, LevelMetrics, Role
from tuner.records.storage import TrialAttr
from tuner.replay.predict import MeasuredTrial
from tuner.search import study as st


def measured_trials(study: Any, study_dir: Path, *, captures: bool = True
                    ) -> list[MeasuredTrial]:
    """Every completed trial with a result, as the predictor takes them; a repeat carries the
    role of the trial it repeats (a baseline's repeat is a baseline run)."""
    trials = study.get_trials(deepcopy=False)
    roles = {t.number: t.user_attrs.get(TrialAttr.ROLE) for t in trials}
    out = []
    for t in trials:
        if t.state != TrialState.COMPLETE or TrialAttr.DUPLICATE_OF in t.user_attrs \
                or TrialAttr.RESULT not in t.user_attrs:
            continue
        result = BenchResult.model_validate(t.user_attrs[TrialAttr.RESULT])
        role = t.user_attrs.get(TrialAttr.ROLE) or Role.SEARCH.value
        if role == Role.REPEAT.value:
            role = roles.get(t.user_attrs.get(TrialAttr.REPEAT_OF)) or role
        levels: dict[int, LevelMetrics] = {lv.concurrency: lv for lv in result.levels}
        path = t.user_attrs[TrialAttr.RESULT].get("engine", {}).get("details") or {}
        out.append(MeasuredTrial(
            number=t.number, config=result.config, role=role, levels=levels,
            capture=st.token_capture(study_dir, t) if captures else None,
            cudagraph_mode=path.get("cudagraph_mode"),
            ngram_path=enginepath.ngram_path_of(path, result.config.method)))
    return out


def aligned_config(study: Any) -> TrialConfig | None:
    """The config of the study's measured aligned baseline (its first completed run); None
    when the study has none."""
    t = first_aligned(study)
    return None if t is None else BenchResult.model_validate(
        t.user_attrs[TrialAttr.RESULT]).config


def first_aligned(study: Any) -> Any:
    """The study's first completed aligned-baseline run, or None."""
    return next((t for t in sorted(study.get_trials(deepcopy=False, states=(
        TrialState.COMPLETE,)), key=lambda t: t.number) if t.user_attrs.get(TrialAttr.ROLE)
        == Role.ALIGNED_BASELINE and TrialAttr.RESULT in t.user_attrs), None)


def has_aligned_baseline(study: Any) -> bool:
    """An aligned baseline is measured, queued, running or refused: never launch another. One
    a dead driver left behind does not count (it is launched again)."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(TrialAttr.ROLE) != Role.ALIGNED_BASELINE:
            continue
        died = t.user_attrs.get(TrialAttr.FAILURE, {}).get("kind") == "driver_died"
        if t.state != TrialState.FAIL or not died:
            return True
    return False


def path_alignment(study: Any) -> tuple[Any, Any] | None:
    """The first completed speculative trial and the Alignment that puts a no-speculation
    engine on its engine path (None there when it ran the plain baseline's path, or a path
    no stored line tells); None until the study has a plain baseline and such a trial."""
    done = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                  key=lambda t: t.number)
    measured = [t for t in done if TrialAttr.RESULT in t.user_attrs
                and TrialAttr.DUPLICATE_OF not in t.user_attrs]
    base = next((t for t in measured if st.is_baseline(t)), None)
    spec = next((t for t in measured
                 if t.user_attrs[TrialAttr.RESULT]["config"].get("speculative_config")), None)
    if base is None or spec is None:
        return None
    return spec, enginepath.alignment(_engine_path(base), _engine_path(spec))


def _engine_path(trial: Any) -> Any:
    return enginepath.EnginePath.from_details(
        trial.user_attrs[TrialAttr.RESULT].get("engine", {}).get("details"))


def aligned_gap(study: Any) -> tuple[Any, Any, Any] | None:
    """(aligned trial, first speculative trial, Alignment still between them) where the
    measured aligned baseline did not land on the speculative path; None where it did, or
    where either is not measured."""
    found = path_alignment(study)
    aligned = first_aligned(study)
    if found is None or aligned is None:
        return None
    gap = enginepath.alignment(_engine_path(aligned), _engine_path(found[0]))
    return None if gap is None else (aligned, found[0], gap)
