"""Outputs stage, traffic replay: the table `tuner predict --traffic` prints, and its
traffic.csv and traffic.json (the rows, with the file, space, levels and notes that produced
them), written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.outputs import files
from tuner.outputs.console import ranked_predictions
from tuner.outputs.text import num, table_line, times, with_pm
from tuner.records.predictions import TrafficRow

TRAFFIC_CSV = "traffic.csv"
TRAFFIC_JSON = "traffic.json"
# One row per config and level (tuner.replay.traffic's TrafficRow, a column per field); the
# order is traffic.csv's. A `_pm` column is the half-width of a 90% interval over the requests (tuner.replay.sampling).
COLUMNS = ("key", "label", "method", "speculative_config", "concurrency", "acceptance_rate",
           "acceptance_rate_pm", "acceptance_length", "acceptance_length_pm", "drafted_per_step",
           "tokens_per_step", "per_position", "num_drafts", "num_draft_tokens",
           "num_accepted_tokens", "pred_output_throughput", "pred_output_throughput_pm",
           "pred_mean_tpot_ms", "pred_mean_tpot_ms_pm", "pred_mean_ttft_ms", "pred_speedup")


def write(rows: Sequence[TrafficRow], header: dict[str, Any], out_dir: Path
          ) -> dict[str, Path]:
    """traffic.csv (COLUMNS, empty cells for missing values) and traffic.json (`header`, then
    the rows) in `out_dir`. Returns {"csv": path, "json": path}."""
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = [r.csv_row() for r in rows]
    frame = pd.DataFrame(cells, columns=list(COLUMNS))
    return {"csv": files.write_atomic(out_dir / TRAFFIC_CSV, frame.to_csv(index=False)),
            "json": files.write_json(out_dir / TRAFFIC_JSON,
                                     {**header, "rows": [{k: r[k] for k in COLUMNS}
                                                         for r in cells]})}


def table(rows: Sequence[TrafficRow], *, top: int, levels: list[int]) -> str:
    """A block per level: the baseline, then the `top` configs by predicted throughput where
    a study priced the level, else by acceptance length."""
    blocks = []
    for c in levels:
        at = [r for r in rows if r.concurrency == c]
        spec = ranked_predictions(at)
        priced = any(r.pred_output_throughput is not None for r in at)
        head = ["config", "acc rate", "acc len", "drafted/step"]
        head += ["pred tok/s", "pred TPOT ms", "speedup"] if priced else []
        body = []
        for r in [r for r in at if r.method == "none"][:1] + spec[:max(top, 0)]:
            cells = [r.label,
                     with_pm(_pct(r.acceptance_rate), _pct(r.acceptance_rate_pm), "{:.1f}%"),
                     with_pm(r.acceptance_length, r.acceptance_length_pm, "{:.2f}"),
                     num(r.drafted_per_step, "{:.2f}")]
            if priced:
                cells += [with_pm(r.pred_output_throughput, r.pred_output_throughput_pm),
                          with_pm(r.pred_mean_tpot_ms, r.pred_mean_tpot_ms_pm),
                          times(r.pred_speedup)]
            body.append(cells)
        order = "predicted throughput" if priced else "acceptance length"
        widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
        blocks.append("\n".join(
            [f"Concurrency {c}: {len(spec)} configs replayed; top {min(len(spec), top)} by "
             f"{order}", table_line(head, widths), table_line(["-" * w for w in widths], widths)]
            + [table_line(row, widths) for row in body]))
    return "\n\n".join(blocks)


def _pct(rate: float | None) -> float | None:
    return 100.0 * rate if isinstance(rate, (int, float)) else None
