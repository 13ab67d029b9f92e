"""Analysis stage, the rules of the per-batch-size schedule: where a config's speedup over
the baseline falls to 1 within the noise (break_even), K per measured level (choose_k, never
rising with load, so neighbouring bands cannot flip-flop), the bands up to the engine's
max_num_seqs, the schedule's checks under vLLM's published rules, the --speculative-config that
carries it (or why the method's proposer takes none), and a schedule withheld with the static K
offered instead. Pure functions of level stats (tuner.analysis.ladder_stats).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tuner.analysis.ladder_stats import pays
from tuner.records.configs import TrialConfig
from tuner.records.policy import (
    Band,
    BreakEven,
    BreakEvenStatus,
    LevelSpeedup,
    PathChange,
    ScheduleBasis,
    ScheduleCheck,
)


def break_even(stats: dict[int, LevelSpeedup]) -> BreakEven:
    """The concurrency where a config's speedup falls to 1 within the noise: whether it always
    pays, never pays or crosses, the last paying and the first non-paying level, and where it
    crosses (interpolated in log2(concurrency) between those two levels)."""
    levels = sorted(stats)
    first_not = next((c for c in levels if not pays(stats[c])), None)
    if first_not is None:
        return BreakEven(status=BreakEvenStatus.ALWAYS_PAYS, last_paying=levels[-1])
    paying_before = [c for c in levels if c < first_not]
    if not paying_before:
        return BreakEven(status=BreakEvenStatus.NEVER_PAYS, first_not_paying=first_not)
    lo, hi = paying_before[-1], first_not
    s_lo, s_hi = stats[lo].speedup, stats[hi].speedup
    if s_lo > 1.0 >= s_hi and s_lo != s_hi:
        f = (s_lo - 1.0) / (s_lo - s_hi)
        cross = 2 ** (math.log2(lo) + f * (math.log2(hi) - math.log2(lo)))
    else:  # still above 1 but within noise at `hi`: the crossing is at or after hi
        cross = float(hi)
    return BreakEven(status=BreakEvenStatus.CROSSES, concurrency=round(cross, 2),
                     last_paying=lo, first_not_paying=hi)


def choose_k(per_k: dict[int, dict[int, LevelSpeedup]]) -> dict[int, int]:
    """Per measured level, the K whose speedup is highest among those that pay beyond the
    noise (0 = speculation off); then K is made non-increasing with concurrency."""
    levels = sorted({c for stats in per_k.values() for c in stats})
    chosen: dict[int, int] = {}
    cap = math.inf
    for c in levels:
        best_k, best_s = 0, 1.0
        for k, stats in per_k.items():
            st = stats.get(c)
            if st is not None and pays(st) and st.speedup > best_s:
                best_k, best_s = k, st.speedup
        best_k = int(min(best_k, cap))
        cap = best_k
        chosen[c] = best_k
    return chosen


def bands(chosen: dict[int, int], per_k: dict[int, dict[int, LevelSpeedup]], *,
          max_batch: int) -> list[Band]:
    """Inclusive batch-size ranges covering 1..max_batch (the engine's max_num_seqs, from the
    caller), one per run of equal K.

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
            if be.status is BreakEvenStatus.CROSSES and be.concurrency is not None:
                start = min(max(prev_c + 1, math.floor(be.concurrency) + 1), c)
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


def policy_config(chosen: TrialConfig, schedule: Sequence[Band], *,
                  varying_k: tuple[bool, str] | None = None) -> TrialConfig | None:
    """`chosen` with the complete --speculative-config of the schedule (K the largest band's,
    the schedule embedded where K changes); None when K is 0 everywhere (speculation off), and
    None where K differs across bands but the method's proposer takes no changing K
    (`varying_k`: (accepted, why), tuner.speculative.varying_k's answer for the method, which
    tuner.api hands in; None: accepted). vLLM would crash or ignore such a schedule, so the
    policy offers the bands instead (schedule_refused)."""
    k_max = max(k for _, _, k in schedule)
    if k_max == 0:
        return None
    spec = {**(chosen.speculative_config or {}), "num_speculative_tokens": k_max}
    if len({k for _, _, k in schedule}) > 1:
        if schedule_refused(schedule, varying_k) is not None:
            return None
        spec["num_speculative_tokens_per_batch_size"] = [list(b) for b in schedule]
    return chosen.model_copy(update={"speculative_config": spec})


def schedule_refused(schedule: Sequence[Sequence[int]], varying_k: tuple[bool, str] | None
                     ) -> str | None:
    """Why vLLM takes no per-batch-size schedule of these bands (their K changes, and the
    method's proposer cannot take a changing K); None where it does, or K never changes."""
    if varying_k is None or varying_k[0] or len({k for *_, k in schedule}) <= 1:
        return None
    return varying_k[1]


def withheld(schedule: Sequence[Band], *, basis: tuple[ScheduleBasis, ...],
             changes: Sequence[PathChange] = (), levels: Sequence[int] = (),
             vllm_source: str | None = None, vllm_issue: int | None = None) -> ScheduleCheck:
    """A schedule not emitted, why, and what holds instead: each band's K as a static engine
    (the bands were measured that way), and the static K of the band that pays (the largest
    K: K never rises with load) for one engine."""
    k_paying = max(k for *_, k in schedule)
    return ScheduleCheck(basis=basis, changes=tuple(changes), levels=tuple(sorted(set(levels))),
                         vllm_source=vllm_source, vllm_issue=vllm_issue,
                         schedule=tuple(tuple(b) for b in schedule),
                         offered_k=k_paying or None, offered_bands=tuple(schedule))


