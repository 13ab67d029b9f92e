"""Outputs stage, the reason column of trials.csv, trials_raw.csv and the report's tables in
words: a failed trial's own text, else what its state says (tuner.analysis.frame keeps the
failure's text only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


# The reason column's words for a trial without a failure text of its own.
_STATE_REASONS = {
    "RUNNING": "not finished: still running, or the driver was stopped (rerun the same "
               "command to resume)",
    "WAITING": "queued, not started yet",
    "PRUNED": "pruned by the sampler before it was measured",
}
_NO_FAILURE_TEXT = "failed without a recorded reason"
_NO_RESULT = "completed without a stored result (nothing to analyse)"


def with_reasons(df: pd.DataFrame) -> pd.DataFrame:
    """`df` (a trials_frame, or its configs_frame) with its reason column in words: a failed
    trial's own text, else what its state says (tuner.analysis.frame keeps the failure's text
    only)."""
    import pandas as pd

    if df.empty or "reason" not in df.columns:
        return df
    out = df.copy()

    def words(state: Any, reason: Any, concurrency: Any) -> Any:
        if state == "FAIL":
            return reason if isinstance(reason, str) and reason else _NO_FAILURE_TEXT
        if state in _STATE_REASONS:
            return _STATE_REASONS[state]
        if state == "COMPLETE" and pd.isna(concurrency):
            return _NO_RESULT
        return reason

    out["reason"] = [words(*cells) for cells in zip(
        out["state"], out["reason"], out["concurrency"], strict=True)]
    return out
