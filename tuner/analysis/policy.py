"""Policy stage: where speculation stops paying, and the per-batch-size schedule vLLM takes.

From the leading configs of a study we measure a concurrency ladder (1, 2, 4, ... in one engine
launch per config and repeat, interleaved with the baseline), find each config's break-even
concurrency (speedup over the baseline falls to 1 within the measured noise), choose per band
of concurrency the best K for the chosen method (K never rises with load, so neighbouring
bands cannot flip-flop), emit `num_speculative_tokens_per_batch_size` where the method's
proposer takes a changing K (tuner.speculative.varying_k, handed in by tuner.api; else the
bands, a static K each, and why), and verify the emitted config on the same ladder, then open
loop at each band edge (open_loop_plan / open_loop_check / with_open_loop: vLLM keys K on the
scheduled requests, prefills included, so arrivals swing it across an edge; bands merge where
the schedule dips beyond the spread). Where the study has an aligned baseline (no speculation on the
speculative engine path), the ladder measures it too and every speedup over the plain baseline
is split into path cost (aligned over plain) x speculation gain (config over aligned), each with
its noise; the decisions stay against the plain baseline, which is what a user gets. This module
holds the rules (pure functions of measured runs); tuner/search/ladder.py measures and
tuner/api.py's policy() runs the whole step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.analysis import decomposition, frame
from tuner.errors import ConfigError
from tuner.records.configs import TrialConfig
from tuner.records.results import Measured, SpeedupSplit

if TYPE_CHECKING:
    import pandas as pd

ALIGNED_ROLE = "aligned_baseline"  # tuner.records.results.Role.ALIGNED_BASELINE, as runs store it
UNMEASURED_NOISE = 0.05  # relative; used where a level has a single measurement


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
        x, b = _measured(xs), _measured(bs)
        ratio = x.over(b)
        out[c] = {"speedup": ratio.value, "noise": ratio.relative_spread,
                  "throughput": x.value, "baseline": b.value, "n": len(xs), "n_baseline": len(bs)}
    return out


def _measured(xs: Sequence[float]) -> Measured:
    """A series of runs as its median and relative noise (_rel_mad)."""
    return Measured(value=statistics.median(xs), relative_spread=_rel_mad(xs))


def _rel_mad(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return UNMEASURED_NOISE
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    # A MAD of two runs understates the spread; never claim less than 1%.
    return max(mad / med if med > 0 else math.inf, 0.01)


def split_stats(throughputs: dict[int, Sequence[float]], baseline: dict[int, Sequence[float]],
                aligned: dict[int, Sequence[float]]) -> dict[int, dict[str, float]]:
    """level_stats over the plain baseline with, at each level where the aligned baseline was
    measured too, the split (tuner.analysis.decomposition.policy_stats): path_cost (aligned
    over plain) and speculation_gain (the config over aligned), each with its noise. The
    medians' ratios multiply back exactly: speedup = path_cost x speculation_gain."""
    out = {}
    for c, stat in level_stats(throughputs, baseline).items():
        split = None
        if aligned.get(c):
            split = SpeedupSplit.of(_measured(throughputs[c]), plain=_measured(baseline[c]),
                                    aligned=_measured(aligned[c]))
        out[c] = decomposition.policy_stats(stat, split)
    return out


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
          max_batch: int) -> list[tuple[int, int, int]]:
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


def policy_config(base_spec: dict[str, Any], schedule: list[tuple[int, int, int]], *,
                  varying_k: tuple[bool, str] | None = None) -> dict[str, Any] | None:
    """The complete --speculative-config; None when K is 0 everywhere (speculation off), and
    None where K differs across bands but the method's proposer takes no changing K
    (`varying_k`: (accepted, why), tuner.speculative.varying_k's answer for the method, which
    tuner.api hands in; None: accepted). vLLM would crash or ignore such a schedule, so the
    policy offers the bands instead (schedule_refused)."""
    k_max = max(k for _, _, k in schedule)
    if k_max == 0:
        return None
    spec = {**base_spec, "num_speculative_tokens": k_max}
    if len({k for _, _, k in schedule}) > 1:
        if schedule_refused(schedule, varying_k) is not None:
            return None
        spec["num_speculative_tokens_per_batch_size"] = [list(b) for b in schedule]
    return spec


def schedule_refused(schedule: Sequence[Sequence[int]], varying_k: tuple[bool, str] | None
                     ) -> str | None:
    """Why vLLM takes no per-batch-size schedule of these bands (their K changes, and the
    method's proposer cannot take a changing K); None where it does, or K never changes."""
    if varying_k is None or varying_k[0] or len({k for *_, k in schedule}) <= 1:
        return None
    return varying_k[1]


def bands_verdict(label: str, why: str, schedule: Sequence[Sequence[int]],
                  predicted_ks: Sequence[int]) -> str:
    """The words of a policy that offers bands where vLLM takes no schedule."""
    off = next((s for s, _, k in schedule if k == 0), None)
    stops = (f" speculation stops paying from concurrency {off};" if off is not None else "")
    guessed = sorted({k for *_, k in schedule if k in predicted_ks})
    return (f"No per-batch-size schedule for {label}: {why}. Offered instead: a static K per "
            f"band of concurrency (the router table below: send each band to an engine "
            f"started with that K);{stops} each band's K is the best one measured there"
            + (f" (K {', '.join(map(str, guessed))} predicted by the replay, not measured)"
               if guessed else "")
            + ". No launch was spent on a schedule vLLM would refuse.")


def band_table(schedule: list[tuple[int, int, int]], label: str) -> list[str]:
    """The router fallback: plain-language bands for when the engine ignores the table. The
    last band runs to the engine's batch limit, so it holds for any load above its start."""
    lines = []
    for i, (s, e, k) in enumerate(schedule):
        span = f"concurrency {s} and above" if i == len(schedule) - 1 else \
            f"concurrency {s}-{e}"
        lines.append(f"{span}: " + (f"speculate with {label}, K={k}" if k else "speculation off"))
    return lines


# --- the step's plan and document -------------------------------------------------------------
def ladder_runs(picks: list[TrialConfig], k_values: tuple[int, ...] | None, *, study: str,
                aligned: TrialConfig | None = None) -> list[tuple[str, TrialConfig]]:
    """What the ladder measures: the baseline, the study's aligned baseline where it has one,
    the leaders, and K variants of the first leader (by default its K and half of it)."""
    if not picks:
        raise ConfigError(f"Study '{study}' has no completed speculative trial yet; run "
                          f"`tuner optimize` first (the policy starts from its leading configs).")
    chosen = picks[0]
    # Where vLLM takes K from the draft model (chosen.k is None), only asked-for Ks vary.
    default_ks = (chosen.k, max(1, round(chosen.k / 2))) if chosen.k else ()
    ks = sorted(set(k_values or default_ks), reverse=True)
    runs: list[tuple[str, TrialConfig]] = [("baseline", TrialConfig())]
    if aligned is not None:
        runs.append((ALIGNED_ROLE, aligned))
    runs += [("leader", c) for c in picks]
    for k in ks:
        cfg = chosen.with_k(k)
        # The leader's own K is the leader, however its config spells it.
        if k != chosen.k and cfg.key() not in {r.key() for _, r in runs}:
            runs.append(("k_variant", cfg))
    return runs


def draft_policy(measured: list[dict[str, Any]], runs: list[tuple[str, TrialConfig]], *,
                 max_batch: int, context: dict[str, Any], where: str,
                 predicted: dict[int, dict[int, float]] | None = None,
                 varying_k: tuple[bool, str] | None = None) -> dict[str, Any]:
    """The policy document from the ladder: per config its speedup per level and break-even,
    K per level for the first leader's method, the schedule up to `max_batch` (the engine's
    max_num_seqs) and the speculative config that carries it (None: speculation does not pay
    anywhere). Verification is added later.

    `predicted` ({K: {level: speedup}}, the replay's curves for the chosen config) adds every
    K the ladder did not measure; such a K must pay by more than the chosen leader's measured
    noise at that level, and the schedule it enters is verified on the engine like any other.

    `varying_k` ((accepted, why): whether the chosen method's proposer takes a changing K,
    tuner.speculative.varying_k) decides whether a schedule is emitted: where it is not
    accepted and K differs across bands, the document has no schedule and no config to verify
    (schedule None, speculative_config None), the bands (`bands`, `fallback_bands`) and why
    (`schedule_refused`, the verdict)."""
    chosen = _leader(runs)
    base = throughput_series(measured, TrialConfig().key())
    if not base:
        raise ConfigError("The baseline could not be measured on the ladder (see the failures "
                          f"in {where}); no policy without it.")
    aligned = next((c for role, c in runs if role == ALIGNED_ROLE), None)
    aligned_series = throughput_series(measured, aligned.key()) if aligned is not None else {}
    stats = {c.key(): split_stats(throughput_series(measured, c.key()), base, aligned_series)
             for _, c in runs if c.method != "none"}
    per_k = _measured_ks(runs, stats, chosen)
    measured_ks = sorted(per_k)
    per_k.update(_predicted_ks(predicted or {}, per_k, stats.get(chosen.key(), {})))
    picked = choose_k(per_k)
    schedule = bands(picked, per_k, max_batch=max_batch)
    spec = policy_config(chosen.speculative_config, schedule, varying_k=varying_k)
    refused = schedule_refused(schedule, varying_k)
    doc: dict[str, Any] = {
        **context, "method": chosen.method, "chosen": chosen.label(),
        "configs": [{"label": c.label(), "role": role, "speculative_config":
                     c.speculative_config, "stats": stats.get(c.key(), {}),
                     "break_even": break_even(stats[c.key()]) if stats.get(c.key())
                     else None} for role, c in runs if c.method != "none"],
        "baseline": {str(c): v for c, v in base.items()},
        "k_by_level": picked, "schedule": None if refused else [list(b) for b in schedule],
        "bands": [list(b) for b in schedule], "schedule_refused": refused,
        "k_measured": measured_ks,
        # Every K the bands chose from, measured or predicted: its closed-loop speedup and
        # noise per level (the open-loop check's merges must not give any of it up).
        "k_stats": {str(k): {str(c): {"speedup": st["speedup"], "noise": st["noise"]}
                             for c, st in per_k[k].items()} for k in sorted(per_k)},
        "k_predicted": sorted(k for k in per_k if k not in measured_ks),
        "predicted_speedups": {str(k): {str(c): round(v, 4) for c, v in curve.items()}
                               for k, curve in (predicted or {}).items()},
        "schedule_problems": validate_schedule(schedule, num_speculative_tokens=max(
            [k for *_, k in schedule] + [1])),
        "speculative_config": spec,
        "serve_command": None, "serve_note": None, "verification": None,
        "fallback_bands": None,
        "aligned_baseline": None if aligned is None else {
            "label": aligned.label(), "config": aligned.model_dump(mode="json"),
            "path_cost": {str(c): v for c, v in level_stats(aligned_series, base).items()}},
        "decomposition": decomposition.policy_line(chosen.label(), stats.get(chosen.key(), {})),
    }
    if refused is not None:
        doc["fallback_bands"] = band_table(schedule, chosen.label())
        doc["verdict"] = _with_decomposition(
            bands_verdict(chosen.label(), refused, schedule, doc["k_predicted"]), doc)
    elif spec is None:
        doc["verdict"] = _with_decomposition(
            "Speculation does not pay beyond the noise at any measured level: leave it off.",
            doc)
    return doc


def _leader(runs: list[tuple[str, TrialConfig]]) -> TrialConfig:
    """The first leader: the config whose method and K the policy schedules."""
    return next(c for role, c in runs if role == "leader")


def _measured_ks(runs: list[tuple[str, TrialConfig]], stats: dict[str, dict[int, dict]],
                 chosen: TrialConfig) -> dict[int, dict[int, dict[str, float]]]:
    """{K: level stats} of the ladder's configs that are the chosen one but for K."""
    return {c.k: stats[c.key()] for _, c in runs
            if c.method == chosen.method and c.k is not None and stats.get(c.key())
            and c.speculative_config_without_k() == chosen.speculative_config_without_k()}


def _predicted_ks(predicted: dict[int, dict[int, float]], per_k: dict[int, Any],
                  leader_stats: dict[int, dict[str, float]]
                  ) -> dict[int, dict[int, dict[str, Any]]]:
    """The replay's curves of the Ks the ladder did not measure (measured beats predicted),
    each level held to the chosen leader's measured noise there."""
    return {k: {c: {"speedup": s, "noise": leader_stats[c]["noise"], "predicted": True}
                for c, s in curve.items() if c in leader_stats}
            for k, curve in predicted.items() if k not in per_k}


def _with_decomposition(verdict: str, doc: dict[str, Any]) -> str:
    # The verdict is the line a user reads; whether the path or speculation itself decided
    # belongs in it.
    return verdict + (f" {doc['decomposition']}" if doc.get("decomposition") else "")


def policy_configs(doc: dict[str, Any], runs: list[tuple[str, TrialConfig]]
                   ) -> tuple[TrialConfig, TrialConfig]:
    """(the emitted policy, the static config it replaces: the first leader at its own K)."""
    chosen = _leader(runs)
    policy_cfg = chosen.model_copy(update={"speculative_config": doc["speculative_config"]})
    return policy_cfg, chosen


def with_verification(doc: dict[str, Any], reference: list[dict[str, Any]], *,
                      policy_cfg: TrialConfig, static: TrialConfig, side_by_side: bool
                      ) -> dict[str, Any]:
    """The document with its verification, verdict and, when the engine did not run or honour
    the schedule, the band table a router can use instead."""
    ver = {**verification(reference, policy_cfg, static), "side_by_side": side_by_side}
    out = {**doc, "verification": ver, "verdict": _with_decomposition(ver["verdict"], doc)}
    if ver.get("engine_rejected") or not ver.get("honoured", True):
        out["fallback_bands"] = band_table([tuple(b) for b in doc["schedule"]], doc["chosen"])
    return out


def verification(runs: list[dict[str, Any]], policy_cfg: TrialConfig, static: TrialConfig
                 ) -> dict[str, Any]:
    """How the emitted policy fared on the ladder against the baseline and the static config,
    and whether the engine honoured the schedule."""
    base = throughput_series(runs, TrialConfig().key())
    failures = [r["failure"] for r in runs if r["key"] == policy_cfg.key() and r.get("failure")]
    pol = throughput_series(runs, policy_cfg.key())
    if not pol:
        reason = failures[0]["reason"] if failures else "no successful run"
        return {"engine_rejected": True, "reason": reason,
                "verdict": f"The installed vLLM did not run the schedule ({reason}); use the "
                           f"band table below in a router instead."}
    st_pol = level_stats(pol, base)
    st_static = level_stats(throughput_series(runs, static.key()), base)
    drafts = drafts_series(runs, policy_cfg.key())
    sched = policy_cfg.speculative_config.get("num_speculative_tokens_per_batch_size") or []
    # Honoured: where the table says K=0 the engine drafts far less than the static config
    # at the same level (not zero: as a level drains, the batch shrinks into the K>0 range).
    static_drafts = drafts_series(runs, static.key())
    honoured = True
    for c, values in drafts.items():
        k = next((k for s, e, k in sched if s <= c <= e), None)
        ref = median_or_none(static_drafts.get(c, []))
        if k == 0 and values and ref and median_or_none(values) > 0.5 * ref:
            honoured = False
    rows = []
    worse = []
    for c in sorted(st_pol):
        p, s = st_pol[c], st_static.get(c)
        if loses(p):
            worse.append(c)
        rows.append({"concurrency": c, "policy_speedup": p["speedup"], "policy_noise": p["noise"],
                     "static_speedup": s["speedup"] if s else None,
                     "policy_drafts": median_or_none(drafts.get(c, [])),
                     "below_baseline_beyond_noise": loses(p)})
    low = rows[0]
    verdict = ("Verified on the ladder: the policy is never below the baseline beyond the noise"
               if not worse else
               f"The policy fell below the baseline beyond the noise at concurrency "
               f"{', '.join(map(str, worse))}")
    verdict += (f"; at concurrency {low['concurrency']} it keeps "
                f"{low['policy_speedup']:.2f}x against the static config's "
                f"{(low['static_speedup'] or float('nan')):.2f}x.")
    if not honoured:
        verdict += (" The engine kept drafting where the table says K=0: it ignored the "
                    "schedule; use the band table in a router.")
    return {"engine_rejected": False, "honoured": honoured, "rows": rows, "worse_at": worse,
            "verdict": verdict}


# --- the open-loop check: schedules under arrivals that swing the batch across an edge -------
def band_edges(schedule: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
    """Where K changes: per pair of neighbouring bands, the last batch size of the lower one
    (`edge`; K flips between edge and edge + 1) and the two Ks."""
    return [{"edge": int(lo[1]), "k_below": int(lo[2]), "k_above": int(hi[2])}
            for lo, hi in zip(schedule, schedule[1:], strict=False) if lo[2] != hi[2]]


def open_loop_plan(schedule: Sequence[Sequence[int]], closed: dict[int, Sequence[float]]
                   ) -> list[dict[str, Any]]:
    """Per band edge, the open-loop level that swings the batch across it: Poisson arrivals
    at the closed-loop request throughput at the edge (`closed`: {ladder level: requests/s
    per run}, medians log2-interpolated at edge + 0.5, clamped to the ladder), capped at the
    first ladder level above the edge (so the batch can cross it; vLLM counts prefills in
    the batch the schedule is keyed on). Edges without a ladder level above are left out; two
    edges never share a cap (every band holds a measured level)."""
    levels = sorted(c for c, xs in closed.items() if xs)
    if not levels:
        return []
    med = {c: statistics.median(closed[c]) for c in levels}
    out = []
    for edge in band_edges(schedule):
        cap = next((c for c in levels if c > edge["edge"]), None)
        if cap is None:
            continue
        at = min(max(edge["edge"] + 0.5, levels[0]), levels[-1])
        lo = max(c for c in levels if c <= at)
        hi = min(c for c in levels if c >= at)
        f = 0.0 if hi == lo else (math.log2(at) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        rate = med[lo] + f * (med[hi] - med[lo])
        if rate > 0:
            out.append({**edge, "concurrency": cap, "rate": round(rate, 4),
                        "rate_from": [lo, hi]})
    return out


def open_loop_runs(plan: Sequence[dict[str, Any]], policy_cfg: TrialConfig,
                   chosen: TrialConfig) -> tuple[list[tuple[str, TrialConfig]], dict[int, str]]:
    """What the open-loop phase launches: the schedule, then every K of the bands at the
    planned edges as a static config (the chosen config at that K; K 0 the baseline), and
    {K: config key} for open_loop_check."""
    statics: dict[int, TrialConfig] = {}
    for edge in plan:
        for k in (edge["k_below"], edge["k_above"]):
            statics[k] = (TrialConfig() if k == 0 else chosen if k == chosen.k
                          else chosen.with_k(k))
    runs = [("policy", policy_cfg)] + [("baseline" if k == 0 else "static", cfg)
                                       for k, cfg in sorted(statics.items(), reverse=True)]
    return runs, {k: cfg.key() for k, cfg in statics.items()}


def open_loop_check(plan: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], *,
                    policy_key: str, static_keys: dict[int, str]) -> list[dict[str, Any]]:
    """Per planned edge, the open-loop output throughput (median over repeats, relative MAD)
    of the schedule and of each static K of the two bands (`static_keys`: {K: config key},
    K 0 the baseline), the best static K, schedule over best, and whether the schedule dips
    below it beyond the spread (`dips`: the ratio under 1 by more than the two relative
    spreads added, MAD over median of each one's repeats, UNMEASURED_NOISE for a single run;
    a smaller difference is no finding). An edge not measured for the
    schedule or either K has no verdict (`dips` None)."""
    pol = throughput_series(runs, policy_key)
    out = []
    for edge in plan:
        c = edge["concurrency"]
        row: dict[str, Any] = {**edge, "policy": None, "static": {}, "best_k": None,
                               "ratio": None, "noise": None, "dips": None}
        if pol.get(c):
            row["policy"] = _figure(pol[c], throughput_series(runs, policy_key, TPOT)[c])
        for k in sorted({edge["k_below"], edge["k_above"]}, reverse=True):
            xs = throughput_series(runs, static_keys[k]).get(c) if k in static_keys else None
            if xs:
                row["static"][str(k)] = _figure(
                    xs, throughput_series(runs, static_keys[k], TPOT)[c])
        if row["policy"] is not None and len(row["static"]) == 2:
            best = max(row["static"], key=lambda k: row["static"][k]["throughput"])
            b, p = row["static"][best], row["policy"]
            # The spread of a difference of two medians: both their spreads, added.
            ratio, noise = p["throughput"] / b["throughput"], p["noise"] + b["noise"]
            row.update(best_k=int(best), ratio=round(ratio, 4), noise=round(noise, 4),
                       dips=ratio < 1.0 - noise)
            row["policy_minus_best"] = round(p["throughput"] - b["throughput"], 3)
        out.append(row)
    return out


TPOT = "mean_tpot_ms"


def _figure(xs: Sequence[float], tpots: Sequence[float]) -> dict[str, Any]:
    """Output throughput (median, relative MAD, spread in tok/s) over the repeats, and the
    median mean TPOT beside it (what open-loop load shows first; not what decides)."""
    m = _measured(xs)
    return {"throughput": round(m.value, 3), "noise": round(m.relative_spread, 4),
            "spread": round(m.spread, 3), "n": len(xs),
            "mean_tpot_ms": round(statistics.median(tpots), 3) if tpots else None}


def merge_cost(schedule: Sequence[Sequence[int]], edge: dict[str, Any],
               k_stats: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any] | None:
    """What merging the bands at a dipping `edge` into its best static K would give up on
    the closed-loop ladder: the first level of the band whose K it replaces where that K
    measured (or was predicted) faster than the best K beyond the noise (K 0: speedup 1),
    as {concurrency, k, speedup, merged_k, merged_speedup}; None where it gives up nothing.
    `k_stats`: {K: {level: {speedup, noise}}} (draft_policy's)."""
    best = int(edge["best_k"])
    i = next(i for i, b in enumerate(schedule[:-1]) if b[1] == edge["edge"])
    lo, hi, k = schedule[i + 1] if schedule[i][2] == best else schedule[i]

    def stat(kk: int, c: str) -> dict[str, float] | None:
        return {"speedup": 1.0, "noise": 0.0} if kk == 0 else k_stats.get(str(kk), {}).get(c)

    for c in sorted(k_stats.get(str(k), {}) if k else
                    {c for st in k_stats.values() for c in st}, key=int):
        if not lo <= int(c) <= hi:
            continue
        old, new = stat(k, c), stat(best, c)
        if old is None:
            continue
        if new is None or new["speedup"] < old["speedup"] * (1 - max(old["noise"], new["noise"])):
            return {"concurrency": int(c), "k": int(k), "speedup": round(old["speedup"], 4),
                    "merged_k": best,
                    "merged_speedup": None if new is None else round(new["speedup"], 4)}
    return None


def merged_at_dips(schedule: Sequence[Sequence[int]], edges: Sequence[dict[str, Any]]
                   ) -> list[tuple[int, int, int]]:
    """The schedule with the two bands at every edge that dipped merged into one band of the
    K that measured better there (hysteresis by construction: no K flip is left where one
    cost throughput), unless the edge says the merge would give up a closed-loop gain
    (`gives_up`, merge_cost). Left to right, so K still never rises with load: each merged
    K lies between its neighbours'."""
    out = [list(b) for b in schedule]
    for edge in edges:
        if not edge.get("dips") or edge.get("gives_up"):
            continue
        i = next((i for i, b in enumerate(out[:-1]) if b[1] == edge["edge"]), None)
        if i is None:  # the edge was merged away already
            continue
        out[i:i + 2] = [[out[i][0], out[i + 1][1], int(edge["best_k"])]]
    merged: list[list[int]] = []
    for b in out:
        if merged and merged[-1][2] == b[2]:
            merged[-1][1] = b[1]
        else:
            merged.append(b)
    return [tuple(b) for b in merged]


def with_open_loop(doc: dict[str, Any], edges: list[dict[str, Any]], base_spec: dict[str, Any],
                   *, varying_k: tuple[bool, str] | None = None) -> dict[str, Any]:
    """The document with its open-loop check (`open_loop`: edges, dipped, the schedule as
    verified and as revised) and, where an edge dipped and the merge gives up no closed-loop
    gain (merge_cost; else the edge is kept, `kept_at`, with what it would give up under
    `gives_up`), the revised schedule in its place:
    `schedule`, `bands` and `speculative_config` (policy_config's, so one K left everywhere
    is a static config, and K 0 everywhere no speculation). The closed-loop verification
    stays, about the schedule it measured (`schedule_verified`)."""
    before = [tuple(b) for b in doc["schedule"]]
    edges = [{**e, "gives_up": merge_cost(before, e, doc.get("k_stats") or {})}
             if e.get("dips") else e for e in edges]
    after = merged_at_dips(before, edges)
    revised = after != before
    block = {"edges": edges, "dipped_at": [e["edge"] for e in edges if e.get("dips")],
             "kept_at": [e["edge"] for e in edges if e.get("dips") and e.get("gives_up")],
             "unmeasured_at": [e["edge"] for e in edges if e.get("dips") is None],
             "revised": revised, "schedule_verified": [list(b) for b in before],
             "schedule_revised": [list(b) for b in after] if revised else None}
    out = {**doc, "open_loop": block}
    if revised:
        spec = policy_config(base_spec, after, varying_k=varying_k)
        out.update(schedule=[list(b) for b in after], bands=[list(b) for b in after],
                   speculative_config=spec)
    return out


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def throughput_series(runs: Sequence[dict[str, Any]], key: str, metric: str = "output_throughput"
                      ) -> dict[int, list[float]]:
    """{concurrency: [value per successful run]} for one config key."""
    out: dict[int, list[float]] = {}
    for r in runs:
        if r["key"] != key or not r.get("result"):
            continue
        for lv in r["result"]["levels"]:
            out.setdefault(int(lv["concurrency"]), []).append(float(lv[metric]))
    return out


def drafts_series(runs: Sequence[dict[str, Any]], key: str) -> dict[int, list[float]]:
    return throughput_series(runs, key, "spec_decode_num_drafts")


def leaders(df: pd.DataFrame, n: int) -> list[TrialConfig]:
    """Best completed config per method at the lowest level (medians over repeats)."""
    ok = frame.with_medians(df)
    ok = ok[(ok["state"] == "COMPLETE") & (ok["method"] != "none")]
    if ok.empty:
        return []
    low = ok[ok["concurrency"] == ok["concurrency"].min()]
    best = low.sort_values("output_throughput", ascending=False).drop_duplicates("method")
    configs = frame.configs_of(df)
    return [configs[key] for key in best.head(n)["config_key"]]
