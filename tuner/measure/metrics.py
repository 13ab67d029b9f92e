"""Metrics stage: per-request records + Prometheus counter deltas -> LevelMetrics.

Definitions follow DESIGN.md exactly: output throughput is output tokens of measured requests
over the measured wall time; TPOT is (e2e - TTFT) / (output tokens - 1) per request; chunk ITL
is the gap between streamed chunks (several tokens per chunk under speculation, so reported but
never used as the per-token latency); acceptance comes from deltas of vLLM's spec-decode
counters over the measured phase only. Names and units are `vllm bench serve`'s: acceptance
rate in percent, percentiles keyed "p99_tpot_ms" (the `--metric-percentiles` a user selects
for the `--percentile-metrics` named, beside the fixed p90/p99 fields the tuner needs).
"""

from __future__ import annotations

import math
import re
import statistics
import urllib.request
from collections.abc import Sequence

from tuner.records.results import LevelMetrics, RequestRecord, SpecDecodeCounts

OBJECTIVES = {
    # name: (direction, unit) -- names follow `vllm bench serve`
    "output_throughput": ("maximize", "tok/s"),
    "total_token_throughput": ("maximize", "tok/s"),
    "request_throughput": ("maximize", "req/s"),
    "mean_tpot_ms": ("minimize", "ms"),
    "median_tpot_ms": ("minimize", "ms"),
    "p90_tpot_ms": ("minimize", "ms"),
    "p99_tpot_ms": ("minimize", "ms"),
    "mean_ttft_ms": ("minimize", "ms"),
    "median_ttft_ms": ("minimize", "ms"),
    "p99_ttft_ms": ("minimize", "ms"),
    "mean_e2el_ms": ("minimize", "ms"),
    "p99_e2el_ms": ("minimize", "ms"),
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POS = re.compile(r'position="(\d+)"')
_PREFIX = "vllm:spec_decode_"
_TTFT = "vllm:time_to_first_token_seconds_"  # a histogram: _sum and _count are read


def parse_spec_counters(text: str) -> SpecDecodeCounts:
    """Sum vLLM's spec-decode counters (over engines and label sets) in a /metrics scrape."""
    totals = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    ttft = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        if line.startswith(_TTFT):
            m = _SAMPLE.match(line)
            if m and m.group(1)[len(_TTFT):] in ttft:
                try:
                    ttft[m.group(1)[len(_TTFT):]] += float(m.group(3))
                except ValueError:
                    pass
            continue
        if not line.startswith(_PREFIX):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if name.endswith("_created"):
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        base = name[len(_PREFIX):].removesuffix("_total")
        if base == "num_accepted_tokens_per_pos":
            pm = _POS.search(labels)
            if pm:
                per_pos[int(pm.group(1))] = per_pos.get(int(pm.group(1)), 0.0) + v
        elif base in totals:
            totals[base] += v
    pos = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecDecodeCounts(**totals, accepted_per_pos=pos, server_ttft_s_sum=ttft["sum"],
                            server_ttft_count=ttft["count"])


def scrape(url: str, api_key: str) -> SpecDecodeCounts:
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return parse_spec_counters(r.read().decode(errors="replace"))


def delta(before: SpecDecodeCounts, after: SpecDecodeCounts) -> SpecDecodeCounts:
    n = max(len(before.accepted_per_pos), len(after.accepted_per_pos))
    b = before.accepted_per_pos + (0.0,) * (n - len(before.accepted_per_pos))
    a = after.accepted_per_pos + (0.0,) * (n - len(after.accepted_per_pos))
    return SpecDecodeCounts(
        num_drafts=after.num_drafts - before.num_drafts,
        num_draft_tokens=after.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens=after.num_accepted_tokens - before.num_accepted_tokens,
        accepted_per_pos=tuple(x - y for x, y in zip(a, b, strict=True)),
        server_ttft_s_sum=after.server_ttft_s_sum - before.server_ttft_s_sum,
        server_ttft_count=after.server_ttft_count - before.server_ttft_count,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, as numpy's default (what `vllm bench serve` uses)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def percentile_key(metric: str, p: float) -> str:
    """vLLM's key for one percentile: 99 -> "p99_tpot_ms", 99.9 -> "p99.9_tpot_ms"."""
    word = str(int(p)) if int(p) == p else str(p)
    return f"p{word}_{metric}_ms"


def _stats_ms(values: Sequence[float]) -> tuple[float, float, float, float, float]:
    """Mean, p50, p90, p99 and the population std (numpy's default, as vLLM's), in ms."""
    ms = [v * 1000.0 for v in values]
    if not ms:
        return (math.nan,) * 5
    return (statistics.fmean(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99),
            statistics.pstdev(ms) if len(ms) > 1 else 0.0)


def level_metrics(
    records: Sequence[RequestRecord], *, concurrency: int, duration_s: float,
    warmup_requests: int, counts: SpecDecodeCounts,
    percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl"),
    metric_percentiles: Sequence[float] = (99.0,),
) -> LevelMetrics:
    """Aggregate the measured (non-warm-up) requests of one concurrency level; the selected
    percentiles (vLLM's --percentile-metrics and --metric-percentiles) go in `percentiles`."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    gaps = [g for r in ok for g in r.chunk_gaps_s]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    ttft = _stats_ms(ttfts)
    tpot = _stats_ms(tpots)
    itl = _stats_ms(gaps)
    e2e = _stats_ms(e2es)
    dur = max(duration_s, 1e-9)
    seconds = {"ttft": ttfts, "tpot": tpots, "itl": gaps, "e2el": e2es}
    selected = {percentile_key(m, p): percentile([v * 1000.0 for v in seconds[m]], p)
                for m in percentile_metrics for p in metric_percentiles if seconds[m]}
    acc_rate = acc_len = None
    per_pos: tuple[float, ...] = ()
    if counts.num_draft_tokens > 0:
        acc_rate = 100.0 * counts.num_accepted_tokens / counts.num_draft_tokens
    if counts.num_drafts > 0:
        acc_len = 1.0 + counts.num_accepted_tokens / counts.num_drafts
        per_pos = tuple(x / counts.num_drafts for x in counts.accepted_per_pos)
    errors = sorted({r.error for r in measured if r.error})[:5]
    return LevelMetrics(
        concurrency=concurrency, num_requests=len(measured), completed=len(ok),
        failed=len(measured) - len(ok), warmup_requests=warmup_requests, duration=dur,
        total_input_tokens=in_tokens, total_output_tokens=out_tokens,
        request_throughput=len(ok) / dur, output_throughput=out_tokens / dur,
        total_token_throughput=(in_tokens + out_tokens) / dur,
        mean_ttft_ms=ttft[0], median_ttft_ms=ttft[1], p90_ttft_ms=ttft[2], p99_ttft_ms=ttft[3],
        mean_tpot_ms=tpot[0], median_tpot_ms=tpot[1], p90_tpot_ms=tpot[2], p99_tpot_ms=tpot[3],
        std_tpot_ms=0.0 if math.isnan(tpot[4]) else tpot[4],
        mean_itl_ms=itl[0], median_itl_ms=itl[1], p90_itl_ms=itl[2], p99_itl_ms=itl[3],
        mean_e2el_ms=e2e[0], median_e2el_ms=e2e[1], p99_e2el_ms=e2e[3],
        std_ttft_ms=ttft[4], std_itl_ms=itl[4], std_e2el_ms=e2e[4], percentiles=selected,
        spec_decode_num_drafts=counts.num_drafts,
        spec_decode_draft_tokens=counts.num_draft_tokens,
        spec_decode_accepted_tokens=counts.num_accepted_tokens,
        spec_decode_acceptance_rate=acc_rate, spec_decode_acceptance_length=acc_len,
        spec_decode_per_position_acceptance_rates=per_pos, errors=tuple(errors),
        server_mean_ttft_ms=(1000.0 * counts.server_ttft_s_sum / counts.server_ttft_count
                             if counts.server_ttft_count > 0 else None),
    )
