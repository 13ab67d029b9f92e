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
from tuner.records.results import BenchResult, LevelMetrics
from tuner.records.trials import Role
from tuner.replay.measured import MeasuredTrial
from tuner.search import study as st


def measured_trials(study: Any, study_dir: Path, *, captures: bool = True
                    ) -> list[MeasuredTrial]:
    """Every completed trial with a result, as the predictor takes them; a repeat carries the
    role of the trial it repeats (a baseline's repeat is a baseline run)."""
    trials = study.get_trials(deepcopy=False)
    stored = [st.stored(t) for t in trials]
    roles = {s.number: s.role for s in stored}
    out = []
    for t, s in zip(trials, stored, strict=True):
        if s.state != TrialState.COMPLETE.name or s.duplicate_of is not None \
                or s.result is None:
            continue
        result = s.result
        role = s.role or Role.SEARCH.value
        if role == Role.REPEAT.value:
            role = roles.get(s.repeat_of) or role
        levels: dict[int, LevelMetrics] = {lv.concurrency: lv for lv in result.levels}
        path = result.engine.details
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
    return None if t is None else _result(t).config


def first_aligned(study: Any) -> Any:
    """The study's first completed aligned-baseline run, or None."""
    done = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                  key=lambda t: t.number)
    return next((t for t in done if (s := st.stored(t)).role == Role.ALIGNED_BASELINE
                 and s.result is not None), None)


def has_aligned_baseline(study: Any) -> bool:
    """An aligned baseline is measured, queued, running or refused: never launch another. One
    a dead driver left behind does not count (it is launched again)."""
    for t in study.get_trials(deepcopy=False):
        s = st.stored(t)
        if s.role != Role.ALIGNED_BASELINE:
            continue
        if t.state != TrialState.FAIL or s.failure_kind != "driver_died":
            return True
    return False


def path_alignment(study: Any) -> tuple[Any, Any] | None:
    """The first completed speculative trial and the Alignment that puts a no-speculation
    engine on its engine path (None there when it ran the plain baseline's path, or a path
    no stored line tells); None until the study has a plain baseline and such a trial."""
    done = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                  key=lambda t: t.number)
    measured = [t for t in done if (s := st.stored(t)).result is not None
                and s.duplicate_of is None]
    base = next((t for t in measured if st.is_baseline(t)), None)
    spec = next((t for t in measured if _result(t).config.speculative_config), None)
    if base is None or spec is None:
        return None
    return spec, enginepath.alignment(_engine_path(base), _engine_path(spec))


def _result(trial: Any) -> BenchResult:
    """The result of a trial known to hold one."""
    result = st.stored(trial).result
    assert result is not None  # callers pick trials with a result
    return result


def _engine_path(trial: Any) -> Any:
    return enginepath.EnginePath.from_details(_result(trial).engine.details)


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
