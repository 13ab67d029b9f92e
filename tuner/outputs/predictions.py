"""Outputs stage, the replay's predictions: predicted.csv (written and read back, atomically)
and the report's "Predicted by replay" section. These rows are over the launches' own
requests (where each can be checked against a launch), not the workload sample the answer is
decided on, so the report keeps them in their own section and the recommendation never reads
them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.outputs import files
from tuner.outputs.console import SAMPLED_NOTE, ranked_predictions
from tuner.outputs.text import (
    LAUNCH_SPREAD_NOTE,
    launch_spread,
    ngram_path_note,
    times,
    versus,
    with_pm,
)
from tuner.records.predictions import PredictedRow

if TYPE_CHECKING:
    import pandas as pd

PREDICTED_CSV = "predicted.csv"
# One row per config and level (tuner.replay.predict's PredictedRow, a column per field); the
# order is predicted.csv's. A `_pm` column is the half-width of a 90% interval where the
# baseline sampled (tuner.replay.sampling).
PREDICTION_COLUMNS = (
    "key", "label", "method", "speculative_config", "concurrency", "acceptance_rate",
    "acceptance_rate_pm", "acceptance_length", "acceptance_length_pm", "drafted_per_step",
    "tokens_per_step", "uniform_share", "alternate_stream_requests", "pred_output_throughput",
    "pred_output_throughput_pm", "pred_mean_tpot_ms", "pred_mean_tpot_ms_pm",
    "pred_mean_ttft_ms", "pred_speedup", "path", "measured_trials",
    "meas_output_throughput", "meas_mean_tpot_ms", "meas_mean_ttft_ms", "meas_acceptance_length",
    "err_output_throughput_pct", "err_mean_tpot_pct", "err_acceptance_length_pct",
    "meas_output_throughput_spread_pct", "level_output_throughput_sd_pct", "calibration")
_TOP_PREDICTED = 5


def write_predictions(rows: Sequence[PredictedRow], out_dir: Path) -> Path:
    """Write the predicted table to `out_dir`/predicted.csv, atomically: PREDICTION_COLUMNS in
    that order (empty cells for missing values), then the rows' further fields."""
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = [r.csv_row() for r in rows]
    extra = list(dict.fromkeys(k for r in cells for k in r if k not in PREDICTION_COLUMNS))
    frame = pd.DataFrame(cells, columns=[*PREDICTION_COLUMNS, *extra])
    return files.write_atomic(out_dir / PREDICTED_CSV, frame.to_csv(index=False))


def load_predictions(out_dir: Path) -> pd.DataFrame | None:
    """predicted.csv of `out_dir` with its types restored, or None when there is none or it
    cannot be read (a report is still written without the predictions)."""
    import pandas as pd

    try:
        df = pd.read_csv(Path(out_dir) / PREDICTED_CSV)
    except (OSError, ValueError):  # absent, empty or garbled (pandas' parse errors are these)
        return None
    if not {"key", "label", "method", "concurrency"} <= set(df.columns):
        return None
    # A column a newer or older writer left out reads as missing values, not as a failure.
    df = df.reindex(columns=[*PREDICTION_COLUMNS,
                             *(c for c in df.columns if c not in PREDICTION_COLUMNS)])
    df["concurrency"] = pd.to_numeric(df["concurrency"], errors="coerce")
    df = df[df["concurrency"].notna()].astype({"concurrency": int})
    df["speculative_config"] = df["speculative_config"].fillna("").astype(str)
    df["path"] = df["path"].astype(object).where(df["path"].notna(), None)
    df["measured_trials"] = pd.to_numeric(df["measured_trials"], errors="coerce").fillna(0) \
        .astype(int)
    df["calibration"] = df["calibration"].map(lambda v: str(v).strip().lower() in ("true", "1"))
    return df.reset_index(drop=True)


def prediction_tables(pred: pd.DataFrame | None
                      ) -> tuple[list[str], list[tuple[str, list[str], list[list[str]]]]]:
    """The "Predicted by replay" section: a few sentences, then (title, head, rows) tables:
    the top predicted configs per level and every measured config's prediction error."""
    if pred is None or pred.empty:
        return [], []
    rows = read_rows(pred)
    spec = ranked_predictions(rows)
    levels = sorted({r.concurrency for r in rows})
    measured = [r for r in spec if r.measured_trials > 0]
    paths = sorted({r.path for r in rows if r.path})
    priced = any(r.pred_output_throughput is not None for r in spec)
    intro = [f"{len({r.key for r in spec})} configs predicted from the baseline's own tokens "
             f"at concurrency {', '.join(map(str, levels))}; "
             f"{len({r.key for r in measured})} of them measured, each over the requests "
             f"the launches measure (the workload sample's forecast, where the study has "
             f"one, is in each level's answer above)."]
    intro.append(("Step-cost model: " + "; ".join(paths) + ".") if priced and paths else
                 "No speculative launch calibrates the step cost yet: only acceptance is "
                 "predicted, ranked by acceptance length.")
    if any(r.acceptance_length_pm is not None for r in spec):
        intro.append(SAMPLED_NOTE)
    if (note := ngram_path_note(rows)) is not None:
        intro.append(note)
    tables = []
    for c in levels:
        top = [r for r in spec if r.concurrency == c][:_TOP_PREDICTED]
        if top:
            tables.append((f"Concurrency {c}: top {len(top)} predicted",
                           ["config", "acceptance length", "pred. tok/s", "pred. TPOT ms",
                            "pred. speedup"],
                           [[r.label,
                             with_pm(r.acceptance_length, r.acceptance_length_pm, "{:.2f}"),
                             with_pm(r.pred_output_throughput, r.pred_output_throughput_pm),
                             with_pm(r.pred_mean_tpot_ms, r.pred_mean_tpot_ms_pm),
                             times(r.pred_speedup)] for r in top]))
    if measured:
        intro.append(LAUNCH_SPREAD_NOTE)
        tables.append((
            "Predicted vs measured",
            ["config", "concurrency", "tok/s: predicted / measured (error)",
             "tok/s spread between launches", "TPOT ms: predicted / measured (error)",
             "acceptance length: predicted / measured (error)"],
            [[r.label + (" (calibration, in-sample)" if r.calibration else ""),
              str(r.concurrency),
              versus(r.pred_output_throughput, r.meas_output_throughput,
                     r.err_output_throughput_pct), launch_spread(r),
              versus(r.pred_mean_tpot_ms, r.meas_mean_tpot_ms, r.err_mean_tpot_pct),
              versus(r.acceptance_length, r.meas_acceptance_length,
                     r.err_acceptance_length_pct, "{:.2f}")]
             for r in sorted(measured, key=lambda r: r.concurrency)]))
    return intro, tables


def read_rows(pred: pd.DataFrame) -> list[PredictedRow]:
    """predicted.csv's rows (as load_predictions reads them) as records: a missing cell reads
    as None, or as the field's default where that is not None (a column another writer left
    out); columns no field names are left out."""
    fields = [f for f in dataclasses.fields(PredictedRow) if f.name in pred.columns]
    out = []
    for values in pred[[f.name for f in fields]].itertuples(index=False, name=None):
        cells = {}
        for f, value in zip(fields, values, strict=True):
            cell = _cell(value)
            if cell is None and f.default is dataclasses.MISSING:
                cell = ""  # a key, label or method left empty
            elif cell is None and f.default is not None:
                continue
            cells[f.name] = cell
        out.append(PredictedRow(**cells))
    return out


def _cell(value: object) -> object:
    """A pandas cell as a plain Python value: None for a missing one."""
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
