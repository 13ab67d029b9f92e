"""Report stage: what people read. Tables on the terminal; recommendation.json, trials.csv,
report.md and a self-contained report.html regenerated from the study's storage.
"""

from __future__ import annotations

import math

from tuner.records import BenchResult


def _f(value: float | None, fmt: str = "{:.1f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def bench_table(result: BenchResult) -> str:
    """A fixed-width table of one bench run, a row per concurrency level."""
    head = ["conc", "ok/req", "out tok/s", "TPOT mean", "TPOT p50", "TPOT p99", "TTFT mean",
            "chunk ITL", "accept %", "accept len"]
    rows = []
    for lv in result.levels:
        rows.append([
            str(lv.concurrency), f"{lv.completed}/{lv.num_requests}",
            _f(lv.output_throughput), _f(lv.mean_tpot_ms), _f(lv.median_tpot_ms),
            _f(lv.p99_tpot_ms), _f(lv.mean_ttft_ms), _f(lv.mean_itl_ms),
            _f(None if lv.spec_decode_acceptance_rate is None
               else 100 * lv.spec_decode_acceptance_rate),
            _f(lv.spec_decode_acceptance_length, "{:.2f}"),
        ])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [f"{result.config.label()}  (engine start {result.engine.start_s:.0f} s; "
             f"latencies in ms)",
             "  ".join(h.rjust(w) for h, w in zip(head, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
