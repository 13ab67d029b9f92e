"""`tuner report` and `tuner recommend` as tuner.api runs them: a study's outputs and its
recommendations, regenerated from its storage; no engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.records.recommendations import Recommendation
from tuner.records.storage import StudySettings


def write_report(study: Any, out_dir: Path) -> dict[str, Path]:
    """Analyse an open study as stored and write every output: report.html/.md, trials.csv,
    trials_raw.csv, recommendation.json, plots. Returns {name: path}."""
    return render(study, out_dir)[0]


def report(*, study_dir: Path, storage_url: str | None = None, study_name: str | None = None
           ) -> tuple[dict[str, Path], list[Recommendation]]:
    """Re-render a study's outputs from its storage; returns the written paths and one
    recommendation per level."""
    from tuner.search import study as st

    return render(st.open_existing(study_dir, storage_url, study_name), study_dir)


def render(study: Any, out_dir: Path) -> tuple[dict[str, Path], list[Recommendation]]:
    from tuner.analysis import frame, pareto
    from tuner.outputs import report as outputs
    from tuner.search import study as st

    settings = st.settings_of(study)
    df = pareto.speedups(frame.trials_frame(study))
    recs = recommendations(study, df, settings)
    paths = outputs.write_outputs(
        study_name=study.study_name, df=df, configs=pareto.speedups(frame.configs_frame(df)),
        points=pareto.points(df), recs=recs, out_dir=out_dir, settings=settings)
    return paths, recs


def recommendations(study: Any, df: Any, settings: StudySettings) -> list[Recommendation]:
    """Every level's answer as the study stands: its selections where the replay decided on a
    workload sample, its measured trials elsewhere (tuner.analysis.recommend)."""
    from tuner.analysis import recommend
    from tuner.search import study as st

    return recommend.recommendations(df, settings, st.selections_of(study))


def recommend(*, study_dir: Path, storage_url: str | None = None,
              study_name: str | None = None, level: int | None = None,
              max_tpot_ms: float | None = None, max_ttft_ms: float | None = None
              ) -> Recommendation:
    """The recommendation for one level (default: the first), with the study's SLOs unless
    given here."""
    from tuner.analysis import frame
    from tuner.analysis import recommend as rec
    from tuner.search import study as st

    study = st.open_existing(study_dir, storage_url, study_name)
    settings = st.settings_of(study)
    df = frame.trials_frame(study)
    levels = frame.levels_of(df)
    c = level or (levels[0] if levels else None)
    if c is None or c not in levels:
        raise ConfigError(f"--level {c}: the study measured "
                          f"{', '.join(map(str, levels)) or 'no levels yet'}. Pick one of those.")
    slos = settings.constraints
    chosen = {s.concurrency: s for s in st.selections_of(study)}.get(c)
    if chosen is not None and max_tpot_ms is None and max_ttft_ms is None and not any(
            v is not None for v in slos.values()):
        answer = rec.selected(df, chosen, settings=settings)
        if answer is not None:
            return answer
    return rec.recommend(
        df, concurrency=c, settings=settings,
        max_tpot_ms=max_tpot_ms if max_tpot_ms is not None else slos.get("max_tpot_ms"),
        max_ttft_ms=max_ttft_ms if max_ttft_ms is not None else slos.get("max_ttft_ms"))
