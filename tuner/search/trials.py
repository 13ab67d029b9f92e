"""Search stage, the stored trials as the search reads them: the measured trials the
predictor takes (tuner.replay.predict MeasuredTrial) and the study's aligned baseline.

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
