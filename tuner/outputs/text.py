"""Outputs stage, text: every number, ratio and split as the terminal, report.md, report.html
and the plots write it. The wording of a ratio with its spread and of the split is
tuner.records' (ratio_text, split_text): analysis writes the same words into
recommendation.json and policy.json and may not import this stage, so the rows here call it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from tuner.analysis.frame import number
from tuner.records.predictions import PredictedRow
from tuner.records.speedup import ratio_text


def num(value: float | None, fmt: str = "{:.1f}") -> str:
    """A measured figure, or "-" when it is missing or undefined."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def times(value: float | None) -> str:
    """A ratio without its spread: "1.23x"."""
    return ratio_text(number(value))


def signed_pct(value: float | None) -> str:
    """An error already in percent, signed: "+4.2%" (predicted above measured)."""
    return num(value, "{:+.1f}%")


def with_noise(ratio: float, noise: float) -> str:
    """A ratio with its relative noise, as the policy's tables show it: "1.05x \u00b13%"."""
    return f"{ratio:.2f}x \u00b1{noise:.0%}"


def with_pm(value: Any, pm: Any, fmt: str = "{:.1f}") -> str:
    """A predicted figure with the half-width of its sampling error where it has one:
    "1.43 \u00b10.05" (tuner.replay.sampling), else as `num` writes it."""
    text = num(value, fmt)
    try:
        half = float(pm)
    except (TypeError, ValueError):
        return text
    return f"{text} \u00b1{fmt.format(half)}" if text != "-" and math.isfinite(half) else text


# Said once below a table whose rows carry `launch_spread`.
LAUNCH_SPREAD_NOTE = ("Spread: how far the measured throughput moves between launches, to set "
                      "each error against: \u00b1 half the config's own launches' range over "
                      "their median; sd, where it was launched once, the level's between-launch "
                      "SD pooled over the configs launched twice.")


def launch_spread(row: PredictedRow) -> str:
    """A predicted row's measured noise (tuner.replay.predict): "\u00b14.1%" over the config's
    own launches, "sd 3.0%" pooled over the level's where it ran once, "-" where neither."""
    own = number(row.meas_output_throughput_spread_pct)
    if not math.isnan(own):
        return f"\u00b1{own:.1f}%"
    level = number(row.level_output_throughput_sd_pct)
    return "-" if math.isnan(level) else f"sd {level:.1f}%"


def versus(predicted: Any, measured: Any, error_pct: Any, fmt: str = "{:.1f}") -> str:
    """One cell: "54.0 / 57.4 (-5.9%)", the error left out where it is unknown."""
    err = signed_pct(error_pct)
    return f"{num(predicted, fmt)} / {num(measured, fmt)}" + (f" ({err})" if err != "-" else "")


def ratio(row: Mapping[str, Any], name: str) -> str:
    """One ratio of the split (tuner.analysis.decomposition.COLUMNS) from a frame row or a
    recommendation's record: its value and `<name>_spread`."""
    return ratio_text(number(row.get(name)), number(row.get(f"{name}_spread")))


# What a prediction row's ngram_path (tuner.replay.predict) means, in words.
NGRAM_PATH_NOTES = {
    "unknown": ("No n-gram launch of this study recorded which n-gram proposer its engine ran "
                "(its model runner was not in the log), so the n-gram rows replay vLLM's V1 "
                "proposer (vllm/v1/spec_decode/ngram_proposer.py) and may not be the engine's: "
                "on the V2 model runner (vLLM's GPU default from 0.3x) n-gram is a Triton scan "
                "that drafts all K tokens every step, padding with the last token, so drafted "
                "tokens per step, and the cost side of every n-gram prediction, differ."),
    "V1": ("The n-gram rows replay vLLM's V1 n-gram proposer "
           "(vllm/v1/spec_decode/ngram_proposer.py), the one this study's n-gram launches ran "
           "(the V1 model runner): it drafts only the tokens it matched."),
    "V2": ("The n-gram rows replay the V2 model runner's n-gram proposer, the one this study's "
           "n-gram launches ran: a Triton scan (vllm/v1/worker/gpu/spec_decode/ngram/) that "
           "drafts all K tokens every step, after the latest occurrence of the longest matching "
           "n-gram, padded with the last token (tuner/replay/ngram_v2.py)."),
}


def ngram_path_note(rows: Iterable[PredictedRow]) -> str | None:
    """The sentence on which n-gram proposer the n-gram rows replay (their ngram_path); None
    where no row says (no n-gram row, or a predicted.csv from before the path was kept)."""
    paths = {r.ngram_path for r in rows if r.method == "ngram"}
    paths = {p for p in paths if isinstance(p, str) and p in NGRAM_PATH_NOTES}
    if not paths:
        return None
    return NGRAM_PATH_NOTES["unknown" if "unknown" in paths or len(paths) > 1
                            else next(iter(paths))]


def table_line(cells: list[str], widths: list[int]) -> str:
    """The first cell (a label) left-aligned, figures right-aligned."""
    return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(cells, widths, strict=True))).rstrip()
