"""Policy stage: where speculation stops paying, and the per-batch-size schedule vLLM takes.

From the leading configs of a study we measure a concurrency ladder (1, 2, 4, ... in one engine
launch per config and repeat, interleaved with the baseline), find each config's break-even
concurrency (speedup over the baseline falls to 1 within the measured noise), choose per band
of concurrency the best K for the chosen method (K never rises with load, so neighbouring
bands cannot flip-flop), emit `num_speculative_tokens_per_batch_size`, and verify the emitted
config on the same ladder. This module holds the rules (pure functions); tuner/campaign.py
measures and tuner/api.py's policy() runs the whole step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

UNMEASURED_NOISE = 0.05  # relative; used where a level has a single measurement
MAX_BATCH = 1024  # end of the last range when the engine's max_num_seqs is not known


# --- rules (pure) ---------------------------------------------------------------------------
def level_stats(throughputs: dict[int, Sequence[float]],
                baseline: dict[int, Sequence[float]]) -> dict[int, dict[str, float]]:
    """Per level: median speedup over the baseline and the relative noise (larger MAD/median
    of the two series, or UNMEASURED_NOISE with a single measurement)."""
    out = {}
    for c in sorted(throughputs):
        xs, bs = list(throughputs[c]), list(baseline.get(c, ()))
        if not xs or not bs:
            continue
        mx, mb = statistics.median(xs), statistics.median(bs)
        noise = max(_rel_mad(xs), _rel_mad(bs))
        out[c] = {"speedup": mx / mb if mb > 0 else math.nan, "noise": noise,
                  "throughput": mx, "baseline": mb, "n": len(xs), "n_baseline": len(bs)}
    return out


def _rel_mad(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return UNMEASURED_NOISE
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    # A MAD of two runs understates the spread; never claim less than 1%.
    return max(mad / med if med > 0 else math.inf, 0.01)


def pays(stat: dict[str, float]) -> bool:
    return stat["speedup"] > 1.0 + stat["noise"]


def loses(stat: dict[str, float]) -> bool:
    return stat["speedup"] < 1.0 - stat["noise"]


def break_even(stats: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The concurrency where a config's speedup falls to 1 within the noise.

    Returns {"status": "always_pays" | "never_pays" | "crosses", "concurrency": float | None,
    "last_paying": int | None, "first_not_paying": int | None}. The crossing is interpolated
    in log2(concurrency) between the last paying and the first non-paying level.
    """
    levels = sorted(stats)
    first_not = next((c for c in levels if not pays(stats[c])), None)
    if first_not is None:
        return {"status": "always_pays", "concurrency": None, "last_paying": levels[-1],
                "first_not_paying": None}
    paying_before = [c for c in levels if c < first_not]
    if not paying_before:
        return {"status": "never_pays", "concurrency": None, "last_paying": None,
                "first_not_paying": first_not}
    lo, hi = paying_before[-1], first_not
    s_lo, s_hi = stats[lo]["speedup"], stats[hi]["speedup"]
    if s_lo > 1.0 >= s_hi and s_lo != s_hi:
        f = (s_lo - 1.0) / (s_lo - s_hi)
        cross = 2 ** (math.log2(lo) + f * (math.log2(hi) - math.log2(lo)))
    else:  # still above 1 but within noise at `hi`: the crossing is at or after hi
        cross = float(hi)
    return {"status": "crosses", "concurrency": round(cross, 2), "last_paying": lo,
            "first_not_paying": hi}


def choose_k(per_k: dict[int, dict[int, dict[str, float]]]) -> dict[int, int]:
    """Per measured level, the K whose speedup is highest among those that pay beyond the
    noise (0 = speculation off); then K is made non-increasing with concurrency."""
    levels = sorted({c for stats in per_k.values() for c in stats})
    chosen: dict[int, int] = {}
    cap = math.inf
    for c in levels:
        best_k, best_s = 0, 1.0
        for k, stats in per_k.items():
            st = stats.get(c)
            if st is not None and pays(st) and st["speedup"] > best_s:
                best_k, best_s = k, st["speedup"]
        best_k = int(min(best_k, cap))
        cap = best_k
        chosen[c] = best_k
    return chosen


def bands(chosen: dict[int, int], per_k: dict[int, dict[int, dict[str, float]]], *,
          max_batch: int = MAX_BATCH) -> list[tuple[int, int, int]]:
    """Inclusive batch-size ranges covering 1..max_batch, one per run of equal K.

    A boundary between two measured levels lies at the interpolated break-even of the higher
    K when it crosses there, else just above the lower level (conservative: spend as little
    of the unmeasured stretch as possible on a K that was not shown to pay)."""
    levels = sorted(chosen)
    out: list[list[int]] = []
    for i, c in enumerate(levels):
        k = chosen[c]
        if out and out[-1][2] == k:
            continue
        if not out:
            out.append([1, 0, k])
            continue
        prev_c, prev_k = levels[i - 1], out[-1][2]
        start = prev_c + 1
        if prev_k > 0 and prev_k in per_k:
            be = break_even({lc: s for lc, s in per_k[prev_k].items() if lc <= c})
            if be["status"] == "crosses" and be["concurrency"] is not None:
                start = min(max(prev_c + 1, math.floor(be["concurrency"]) + 1), c)
        out[-1][1] = start - 1
        out.append([start, 0, k])
    out[-1][1] = max(max_batch, out[-1][0])
    return [tuple(b) for b in out]


def validate_schedule(schedule: Sequence[Sequence[int]], *, num_speculative_tokens: int
                      ) -> list[str]:
    """Problems with a schedule under vLLM's published rules (empty list = valid): entries are
    (start, end, K) with positive bounds, start <= end, K >= 0, sorted non-overlapping ranges,
    the first starting at 1; K above num_speculative_tokens is capped by vLLM (we flag it)."""
    problems = []
    if not schedule:
        return ["the schedule is empty"]
    prev_end = 0
    for i, entry in enumerate(schedule):
        if len(entry) != 3 or not all(isinstance(v, int) for v in entry):
            problems.append(f"entry {i} {entry!r} is not three integers")
            continue
        s, e, k = entry
        if s <= 0 or e <= 0:
            problems.append(f"entry {i}: range ({s}, {e}) must be positive")
        if s > e:
            problems.append(f"entry {i}: start {s} > end {e}")
        if k < 0:
            problems.append(f"entry {i}: K {k} < 0")
        if k > num_speculative_tokens:
            problems.append(f"entry {i}: K {k} > num_speculative_tokens {num_speculative_tokens}")
        if s <= prev_end:
            problems.append(f"entry {i}: range starts at {s}, overlapping or unsorted")
        prev_end = max(prev_end, e)
    if schedule and schedule[0][0] != 1:
        problems.append("the first range must start at 1")
    return problems


def policy_config(base_spec: dict[str, Any], schedule: list[tuple[int, int, int]]
                  ) -> dict[str, Any] | None:
    """The complete --speculative-config; None when K is 0 everywhere (speculation off)."""
    k_max = max(k for _, _, k in schedule)
    if k_max == 0:
        return None
    spec = {**base_spec, "num_speculative_tokens": k_max}
    if len({k for _, _, k in schedule}) > 1:
        spec["num_speculative_tokens_per_batch_size"] = [list(b) for b in schedule]
    return spec


def band_table(schedule: list[tuple[int, int, int]], label: str) -> list[str]:
    """The router fallback: plain-language bands for when the engine ignores the table."""
    lines = []
    for s, e, k in schedule:
        span = f"concurrency {s}-{e}" if e < MAX_BATCH else f"concurrency {s} and above"
        lines.append(f"{span}: " + (f"speculate with {label}, K={k}" if k else "speculation off"))
    return lines
