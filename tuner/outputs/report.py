"""Outputs stage, the report: recommendation.json, trials.csv, trials_raw.csv, report.md and a
self-contained report.html, rendered from what the analysis computed (tuner.api.report runs the
analysis on the study's storage and hands the frames here), so every file can be regenerated.

This module writes the files; what the report says is tuner.outputs.report_content's, rendered
by report_markdown and report_html. Each level's serve flags are also written as a `vllm serve
--config` YAML file (tuner.outputs.serve_configs, listed in recommendation.json), and the
reason column of the trial tables is in words (tuner.outputs.trial_reasons).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.outputs import decisions, files, report_html, report_markdown, split_table
from tuner.outputs.predictions import PREDICTED_CSV, load_predictions
from tuner.outputs.report_content import ReportContent
from tuner.outputs.serve_configs import write_serve_configs
from tuner.outputs.trial_reasons import with_reasons
from tuner.records.policy import PolicyDocument
from tuner.records.storage import StudySettings

if TYPE_CHECKING:
    import pandas as pd

    from tuner.analysis.pareto import Points
    from tuner.records.recommendations import Recommendation


def write_outputs(*, study_name: str, df: pd.DataFrame, configs: pd.DataFrame, points: Points,
                  recs: Sequence[Recommendation], out_dir: Path, settings: StudySettings
                  ) -> dict[str, Path]:
    """Write trials.csv (`configs`: a row per config and level), trials_raw.csv (`df`: a row per
    trial and level), recommendation.json, the plots and the split's table (`points`: the
    measured points, tuner.analysis.pareto.points), report.md and report.html.

    The caller computed the analysis from the study's storage (tuner.api.report), so this runs
    as well on a finished study as on one still running or whose driver was killed. A
    policy.json and a predicted.csv (the replay's predictions) in `out_dir` are shown too.
    Returns {name: path}.
    """
    from tuner.outputs import plots

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df, configs = with_reasons(df), with_reasons(configs)
    workload = settings.workload.name
    predictions = load_predictions(out_dir)
    drawn, notes = plots.draw_all(points, out_dir / "plots", workload=workload,
                                  recommendations=recs, predictions=predictions)
    policy = _load_policy(out_dir)
    if policy:
        drawn["policy"] = plots.policy_plot(policy, out_dir / "plots", notes=notes)
    doc = ReportContent(study_name=study_name, settings=settings, df=df, recs=list(recs),
                        plots=drawn, notes=notes, out_dir=out_dir)
    doc.policy, doc.predictions = policy, predictions
    doc.split_table = split_table.table(points.measured, recs)
    doc.decisions = decisions.decision_rows(decisions.load_decisions(out_dir))
    doc.config_files = write_serve_configs(recs, out_dir, env=settings.engine_spec.env)
    paths = {
        # Each config once, repeats pooled; every trial (copies answered from storage too)
        # stays in trials_raw.csv for whoever wants the single measurements.
        "trials_csv": files.write_atomic(out_dir / "trials.csv", _csv_text(configs)),
        "trials_raw_csv": files.write_atomic(out_dir / "trials_raw.csv", _csv_text(df)),
        "recommendation_json": files.write_atomic(
            out_dir / "recommendation.json", json.dumps(doc.summary(), indent=2) + "\n"),
        "report_md": files.write_atomic(out_dir / "report.md", report_markdown.render(doc)),
        "report_html": files.write_atomic(out_dir / "report.html", report_html.render(doc)),
    }
    if predictions is not None:
        paths["predicted_csv"] = out_dir / PREDICTED_CSV
    for drawn_files in drawn.values():
        paths.update({f"plot_{p.stem}": p for p in drawn_files})
    paths.update({f"serve_config_c{c}": p for c, p in doc.config_files.items()})
    return paths


def _csv_text(df: pd.DataFrame) -> str:
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(
                lambda v: json.dumps(list(v)) if isinstance(v, (list, tuple)) else v)
    return out.to_csv(index=False)


def _load_policy(out_dir: Path) -> PolicyDocument | None:
    """policy.json as the record it was written from (tuner.api.policy); None where there is
    none, or it cannot be read."""
    path = Path(out_dir) / "policy.json"
    try:
        return PolicyDocument.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
