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
holds the rules (pure functions of measured ladder runs, tuner.records.policy.LadderRun) and
returns the document as a record (PolicyDocument), figures only: tuner.outputs.policy_words
words it, tuner/search/ladder.py measures and tuner/api/policy_pipeline.py runs the whole step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.analysis import decomposition, frame
from tuner.errors import ConfigError
from tuner.records.configs import TrialConfig
from tuner.records.policy import (
    Band,
    BandEdge,
    BreakEven,
    BreakEvenStatus,
    ConfigCurve,
    EdgeCheck,
    Figure,
    LadderRun,
    LevelSpeedup,
    LevelStat,
    MergeCost,
    OpenLoop,
    OpenLoopLevel,
    PathChange,
    PathCostCurve,
    PathRule,
    PolicyContext,
    PolicyDocument,
    ScheduleBasis,
    ScheduleCheck,
    ScheduleVerification,
    VerificationRow,
)
from tuner.records.speedup import Measured, SpeedupSplit
from tuner.records.trials import Role

if TYPE_CHECKING:
    import pandas as pd

UNMEASURED_NOISE = 0.05  # relative; used where a level has a single measurement


# --- rules (pure) ---------------------------------------------------------------------------
def level_stats(throughputs: dict[int, Sequence[float]],
                baseline: dict[int, Sequence[float]]) -> dict[int, LevelStat]:
    """Per level: median speedup over the baseline and the relative noise (larger MAD/median
    of the two series, or UNMEASURED_NOISE with a single measurement)."""
    out = {}
    for c in sorted(throughputs):
        xs, bs = list(throughputs[c]), list(baseline.get(c, ()))
        if not xs or not bs:
            continue
        x, b = _measured(xs), _measured(bs)
        ratio = x.over(b)
        out[c] = LevelStat(speedup=ratio.value, noise=ratio.relative_spread,
                           throughput=x.value, baseline=b.value, n=len(xs), n_baseline=len(bs))
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
                aligned: dict[int, Sequence[float]]) -> dict[int, LevelStat]:
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


def pays(stat: LevelSpeedup) -> bool:
    return stat.speedup > 1.0 + stat.noise


def loses(stat: LevelSpeedup) -> bool:
    return stat.speedup < 1.0 - stat.noise


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


# --- the step's plan and document -------------------------------------------------------------
def ladder_lineup(picks: list[TrialConfig], k_values: tuple[int, ...] | None, *, study: str,
                  aligned: TrialConfig | None = None) -> list[tuple[Role, TrialConfig]]:
    """What the ladder measures, as (role, config): the baseline, the study's aligned baseline
    where it has one, the leaders, and K variants of the first leader (by default its K and
    half of it)."""
    if not picks:
        raise ConfigError(f"Study '{study}' has no completed speculative trial yet; run "
                          f"`tuner optimize` first (the policy starts from its leading configs).")
    chosen = picks[0]
    # Where vLLM takes K from the draft model (chosen.k is None), only asked-for Ks vary.
    default_ks = (chosen.k, max(1, round(chosen.k / 2))) if chosen.k else ()
    ks = sorted(set(k_values or default_ks), reverse=True)
    lineup: list[tuple[Role, TrialConfig]] = [(Role.BASELINE, TrialConfig())]
    if aligned is not None:
        lineup.append((Role.ALIGNED_BASELINE, aligned))
    lineup += [(Role.LEADER, c) for c in picks]
    for k in ks:
        cfg = chosen.with_k(k)
        # The leader's own K is the leader, however its config spells it.
        if k != chosen.k and cfg.key() not in {c.key() for _, c in lineup}:
            lineup.append((Role.K_VARIANT, cfg))
    return lineup


def draft_policy(ladder_runs: Sequence[LadderRun], lineup: list[tuple[Role, TrialConfig]], *,
                 max_batch: int, where: str, context: PolicyContext | None = None,
                 predicted: dict[int, dict[int, float]] | None = None,
                 varying_k: tuple[bool, str] | None = None,
                 path_rule: PathRule | None = None) -> PolicyDocument:
    """The policy document from the ladder: per config of the `lineup` its speedup per level
    and break-even, K per level for the first leader's method, the schedule up to `max_batch`
    (the engine's max_num_seqs) and the speculative config that carries it (None:
    speculation does not pay anywhere). Verification is added later. `context`: what the step
    was run on, copied to the top of the document.

    `predicted` ({K: {level: speedup}}, the replay's curves for the chosen config) adds every
    K the ladder did not measure; such a K must pay by more than the chosen leader's measured
    noise at that level, and the schedule it enters is verified on the engine like any other.

    `varying_k` ((accepted, why): whether the chosen method's proposer takes a changing K,
    tuner.speculative.varying_k) decides whether a schedule is emitted: where it is not
    accepted and K differs across bands, the document has no schedule and no config to verify
    (schedule None, speculative_config None), the bands and why (`schedule_refused`).
    `path_rule` (tuner.speculative.schedule_path's answer for the chosen config's engine path,
    handed in by tuner.api) withholds the schedule the same way where vLLM's source says the
    table moves the engine off the path the bands were measured on (`schedule_check`, basis
    PATH_PREDICTED): no launch is spent on it.
    The document's sentences are tuner.outputs.policy_words'."""
    chosen = _leader(lineup)
    base = throughput_series(ladder_runs, TrialConfig().key())
    if not base:
        raise ConfigError("The baseline could not be measured on the ladder (see the failures "
                          f"in {where}); no policy without it.")
    aligned = next((c for role, c in lineup if role == Role.ALIGNED_BASELINE), None)
    aligned_series = throughput_series(ladder_runs, aligned.key()) if aligned is not None else {}
    stats = {c.key(): split_stats(throughput_series(ladder_runs, c.key()), base, aligned_series)
             for _, c in lineup if c.method != "none"}
    per_k = _measured_ks(lineup, stats, chosen)
    measured_ks = sorted(per_k)
    per_k.update(_predicted_ks(predicted or {}, per_k, stats.get(chosen.key(), {})))
    picked = choose_k(per_k)
    schedule = bands(picked, per_k, max_batch=max_batch)
    spec = policy_config(chosen, schedule, varying_k=varying_k)
    refused = schedule_refused(schedule, varying_k)
    check = None
    if refused is None and spec is not None and path_rule is not None and path_rule.changes \
            and len({k for *_, k in schedule}) > 1:
        check = withheld(schedule, basis=(ScheduleBasis.PATH_PREDICTED,),
                         changes=path_rule.changes, vllm_source=path_rule.vllm_source)
        spec = None
    k_predicted = sorted(k for k in per_k if k not in measured_ks)
    doc = PolicyDocument(
        **dict(context or PolicyContext()), method=chosen.method, chosen=chosen.label(),
        configs=tuple(ConfigCurve(label=c.label(), role=role,
                                  speculative_config=c.speculative_config,
                                  stats=stats.get(c.key(), {}),
                                  break_even=break_even(stats[c.key()]) if stats.get(c.key())
                                  else None) for role, c in lineup if c.method != "none"),
        baseline=base, k_by_level=picked,
        schedule=None if refused or check else tuple(schedule),
        bands=tuple(schedule), schedule_refused=refused, k_measured=tuple(measured_ks),
        # Every K the bands chose from, measured or predicted: its closed-loop speedup and
        # noise per level (the open-loop check's merges must not give any of it up).
        k_stats={k: {c: LevelSpeedup(speedup=st.speedup, noise=st.noise)
                     for c, st in per_k[k].items()} for k in sorted(per_k)},
        k_predicted=tuple(k_predicted),
        predicted_speedups={k: {c: round(v, 4) for c, v in curve.items()}
                            for k, curve in (predicted or {}).items()},
        schedule_problems=tuple(validate_schedule(schedule, num_speculative_tokens=max(
            [k for *_, k in schedule] + [1]))),
        speculative_config=None if spec is None else spec.speculative_config,
        aligned_baseline=None if aligned is None else PathCostCurve(
            label=aligned.label(), config=aligned, path_cost=level_stats(aligned_series, base)),
        path_rule=path_rule, schedule_check=check,
    )
    return doc


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


def engine_details(ladder_runs: Sequence[LadderRun], key: str) -> dict[str, str]:
    """The engine path a config's first measured run logged (EngineInfo.details); {} where no
    run of it was measured."""
    return next((dict(run.result.engine.details) for run in ladder_runs
                 if run.key == key and run.result is not None), {})


def _leader(lineup: list[tuple[Role, TrialConfig]]) -> TrialConfig:
    """The first leader: the config whose method and K the policy schedules."""
    return next(c for role, c in lineup if role == Role.LEADER)


def _measured_ks(lineup: list[tuple[Role, TrialConfig]], stats: dict[str, dict[int, LevelStat]],
                 chosen: TrialConfig) -> dict[int, dict[int, LevelSpeedup]]:
    """{K: level stats} of the ladder's configs that are the chosen one but for K."""
    return {c.k: stats[c.key()] for _, c in lineup
            if c.method == chosen.method and c.k is not None and stats.get(c.key())
            and c.speculative_config_without_k() == chosen.speculative_config_without_k()}


def _predicted_ks(predicted: dict[int, dict[int, float]],
                  per_k: dict[int, dict[int, LevelSpeedup]], leader_stats: dict[int, LevelStat]
                  ) -> dict[int, dict[int, LevelSpeedup]]:
    """The replay's curves of the Ks the ladder did not measure (measured beats predicted),
    each level held to the chosen leader's measured noise there."""
    return {k: {c: LevelSpeedup(speedup=s, noise=leader_stats[c].noise)
                for c, s in curve.items() if c in leader_stats}
            for k, curve in predicted.items() if k not in per_k}


def policy_configs(doc: PolicyDocument, lineup: list[tuple[Role, TrialConfig]]
                   ) -> tuple[TrialConfig, TrialConfig]:
    """(the emitted policy, the static config it replaces: the first leader at its own K)."""
    chosen = _leader(lineup)
    policy_cfg = chosen.model_copy(update={"speculative_config": doc.speculative_config})
    return policy_cfg, chosen


def with_verification(doc: PolicyDocument, reference: Sequence[LadderRun], *,
                      policy_cfg: TrialConfig, static: TrialConfig, side_by_side: bool,
                      path_fields: Sequence[str] = ()) -> PolicyDocument:
    """The document with its verification (`side_by_side`: whether the baseline and the
    static config were re-measured beside the schedule). Where the verify launch ran another
    engine path than the static config (on `path_fields`, tuner.measure.enginepath.FIELDS,
    handed in by tuner.api), ignored the table or measured slower (schedule_check_of), the
    schedule is withheld: no schedule, no speculative config, no serve command, and the
    `schedule_check` that says why and offers the static K of the band that pays."""
    return doc.model_copy(update=verified(doc, reference, policy_cfg=policy_cfg, static=static,
                                          side_by_side=side_by_side, path_fields=path_fields))


def verified(doc: PolicyDocument, reference: Sequence[LadderRun], *, policy_cfg: TrialConfig,
             static: TrialConfig, side_by_side: bool, path_fields: Sequence[str] = ()
             ) -> dict[str, Any]:
    """with_verification's fields of the document, for the caller that builds it once."""
    ver = verification(reference, policy_cfg, static, path_fields=path_fields).model_copy(
        update={"side_by_side": side_by_side})
    check = schedule_check_of(doc, ver)
    if check is None:
        return {"verification": ver}
    return {"verification": ver, "schedule_check": check, "schedule": None,
            "speculative_config": None, "serve_command": None}


def schedule_check_of(doc: PolicyDocument, ver: ScheduleVerification
                      ) -> ScheduleCheck | None:
    """Why the verified schedule is not emitted (None: it holds): it ran another engine path
    than the static config, drafted where the table says K=0 or not where it says K>0 (the
    vLLM issue the document's path rule names for that path, where one applies), or measured
    slower than its band's static K (the baseline in a K=0 band) beyond the noise."""
    if ver.engine_rejected or doc.schedule is None:
        return None
    basis = tuple(b for b, found in ((ScheduleBasis.PATH_MEASURED, ver.path_changes),
                                     (ScheduleBasis.DRAFTS_WHERE_OFF, ver.drafts_where_off),
                                     (ScheduleBasis.NO_DRAFTS_WHERE_ON, ver.no_drafts_where_on),
                                     (ScheduleBasis.SLOWER, ver.slower_at)) if found)
    if not basis:
        return None
    levels = ver.drafts_where_off + ver.no_drafts_where_on + ver.slower_at
    ignored = bool(ver.drafts_where_off or ver.no_drafts_where_on)
    rule = doc.path_rule
    return withheld(doc.schedule, basis=basis, changes=ver.path_changes, levels=levels,
                    vllm_issue=rule.ignored_issue if ignored and rule is not None else None)


def verification(ladder_runs: Sequence[LadderRun], policy_cfg: TrialConfig,
                 static: TrialConfig, *, path_fields: Sequence[str] = ()
                 ) -> ScheduleVerification:
    """How the emitted policy fared on the ladder against the baseline and the static config,
    whether the engine honoured the schedule (drafts per level against the table) and ran the
    static config's engine path (`path_fields` of their logged paths), and where it was slower
    than its band's static K."""
    base = throughput_series(ladder_runs, TrialConfig().key())
    failures = [run.failure for run in ladder_runs
                if run.key == policy_cfg.key() and run.failure is not None]
    pol = throughput_series(ladder_runs, policy_cfg.key())
    if not pol:
        reason = failures[0].reason if failures else "no successful run"
        return ScheduleVerification(engine_rejected=True, reason=reason)
    st_pol = level_stats(pol, base)
    st_static = level_stats(throughput_series(ladder_runs, static.key()), base)
    drafts = drafts_series(ladder_runs, policy_cfg.key())
    sched = (policy_cfg.speculative_config or {}).get(
        "num_speculative_tokens_per_batch_size") or []
    # Honoured: where the table says K=0 the engine drafts far less than the static config
    # at the same level (not zero: as a level drains, the batch shrinks into the K>0 range);
    # where it says K>0, it drafts (the static config's count within a half).
    static_drafts = drafts_series(ladder_runs, static.key())
    off, on_missing = [], []
    for c, values in drafts.items():
        k = next((k for s, e, k in sched if s <= c <= e), None)
        ref = median_or_none(static_drafts.get(c, []))
        got = median_or_none(values)
        if k == 0 and got is not None and ref and got > 0.5 * ref:
            off.append(c)
        if k and got is not None and ref and got < 0.5 * ref:
            on_missing.append(c)
    rows = []
    worse, slower = [], []
    for c in sorted(st_pol):
        p, s = st_pol[c], st_static.get(c)
        k = next((k for lo, hi, k in sched if lo <= c <= hi), None)
        if loses(p):
            worse.append(c)
        # Against what the band promised: its static K (the static config where K is its K;
        # the spreads of the two added), the baseline where K=0.
        if (k == 0 and loses(p)) or (k and k == static.k and s is not None
                                      and p.speedup < s.speedup * (1 - p.noise - s.noise)):
            slower.append(c)
        rows.append(VerificationRow(
            concurrency=c, policy_speedup=p.speedup, policy_noise=p.noise,
            static_speedup=s.speedup if s else None,
            policy_drafts=median_or_none(drafts.get(c, [])),
            below_baseline_beyond_noise=loses(p)))
    return ScheduleVerification(engine_rejected=False, honoured=not off, rows=tuple(rows),
                        worse_at=tuple(worse), drafts_where_off=tuple(sorted(off)),
                        no_drafts_where_on=tuple(sorted(on_missing)), slower_at=tuple(slower),
                        path_changes=path_changes(
                            engine_details(ladder_runs, static.key()),
                            engine_details(ladder_runs, policy_cfg.key()), path_fields))


def path_changes(static: dict[str, str], schedule: dict[str, str], fields: Sequence[str]
                 ) -> tuple[PathChange, ...]:
    """The `fields` of two logged engine paths that both know and on which they differ."""
    return tuple(PathChange(field=f, static=static[f], schedule=schedule[f]) for f in fields
                 if static.get(f) and schedule.get(f) and static[f] != schedule[f])


# --- the open-loop check: schedules under arrivals that swing the batch across an edge -------
def band_edges(schedule: Sequence[Band]) -> list[BandEdge]:
    """Where K changes: per pair of neighbouring bands, the last batch size of the lower one
    (`edge`; K flips between edge and edge + 1) and the two Ks."""
    return [BandEdge(edge=int(lo[1]), k_below=int(lo[2]), k_above=int(hi[2]))
            for lo, hi in zip(schedule, schedule[1:], strict=False) if lo[2] != hi[2]]


def open_loop_plan(schedule: Sequence[Band], closed: dict[int, Sequence[float]]
                   ) -> list[OpenLoopLevel]:
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
        cap = next((c for c in levels if c > edge.edge), None)
        if cap is None:
            continue
        at = min(max(edge.edge + 0.5, levels[0]), levels[-1])
        lo = max(c for c in levels if c <= at)
        hi = min(c for c in levels if c >= at)
        f = 0.0 if hi == lo else (math.log2(at) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        rate = med[lo] + f * (med[hi] - med[lo])
        if rate > 0:
            out.append(OpenLoopLevel(**dict(edge), concurrency=cap, rate=round(rate, 4),
                                     rate_from=(lo, hi)))
    return out


def open_loop_lineup(plan: Sequence[OpenLoopLevel], policy_cfg: TrialConfig,
                     chosen: TrialConfig) -> tuple[list[tuple[Role, TrialConfig]], dict[int, str]]:
    """What the open-loop phase launches, as (role, config): the schedule, then every K of the
    bands at the planned edges as a static config (the chosen config at that K; K 0 the
    baseline), and {K: config key} for open_loop_check."""
    statics: dict[int, TrialConfig] = {}
    for edge in plan:
        for k in (edge.k_below, edge.k_above):
            statics[k] = (TrialConfig() if k == 0 else chosen if k == chosen.k
                          else chosen.with_k(k))
    lineup = [(Role.POLICY, policy_cfg)] + [(Role.BASELINE if k == 0 else Role.STATIC, cfg)
                                         for k, cfg in sorted(statics.items(), reverse=True)]
    return lineup, {k: cfg.key() for k, cfg in statics.items()}


def open_loop_check(plan: Sequence[OpenLoopLevel], ladder_runs: Sequence[LadderRun], *,
                    policy_key: str, static_keys: dict[int, str]) -> list[EdgeCheck]:
    """Per planned edge, the open-loop output throughput (median over repeats, relative MAD)
    of the schedule and of each static K of the two bands (`static_keys`: {K: config key},
    K 0 the baseline), the best static K, schedule over best, and whether the schedule dips
    below it beyond the spread (`dips`: the ratio under 1 by more than the two relative
    spreads added, MAD over median of each one's repeats, UNMEASURED_NOISE for a single run;
    a smaller difference is no finding). An edge not measured for the
    schedule or either K is not decided (`dips` None)."""
    pol = throughput_series(ladder_runs, policy_key)
    out = []
    for edge in plan:
        c = edge.concurrency
        policy = None
        if pol.get(c):
            policy = _figure(pol[c], throughput_series(ladder_runs, policy_key, TPOT)[c])
        static: dict[int, Figure] = {}
        for k in sorted({edge.k_below, edge.k_above}, reverse=True):
            xs = throughput_series(ladder_runs, static_keys[k]).get(c) \
                if k in static_keys else None
            if xs:
                static[k] = _figure(xs, throughput_series(ladder_runs, static_keys[k], TPOT)[c])
        row = EdgeCheck(**dict(edge), policy=policy, static=static)
        if policy is not None and len(static) == 2:
            best = max(static, key=lambda k: static[k].throughput)
            b = static[best]
            # The spread of a difference of two medians: both their spreads, added.
            ratio, noise = policy.throughput / b.throughput, policy.noise + b.noise
            row = row.model_copy(update={
                "best_k": int(best), "ratio": round(ratio, 4), "noise": round(noise, 4),
                "dips": ratio < 1.0 - noise,
                "policy_minus_best": round(policy.throughput - b.throughput, 3)})
        out.append(row)
    return out


TPOT = "mean_tpot_ms"


def _figure(xs: Sequence[float], tpots: Sequence[float]) -> Figure:
    """Output throughput (median, relative MAD, spread in tok/s) over the repeats, and the
    median mean TPOT beside it (what open-loop load shows first; not what decides)."""
    m = _measured(xs)
    return Figure(throughput=round(m.value, 3), noise=round(m.relative_spread, 4),
                  spread=round(m.spread, 3), n=len(xs),
                  mean_tpot_ms=round(statistics.median(tpots), 3) if tpots else None)


def merge_cost(schedule: Sequence[Band], k_stats: dict[int, dict[int, LevelSpeedup]], *,
               edge: int, best_k: int) -> MergeCost | None:
    """What merging the bands at a dipping `edge` into its best static K would give up on
    the closed-loop ladder: the first level of the band whose K it replaces where that K
    measured (or was predicted) faster than the best K beyond the noise (K 0: speedup 1);
    None where it gives up nothing. `k_stats`: {K: {level: speedup and noise}}
    (draft_policy's)."""
    i = next(i for i, b in enumerate(schedule[:-1]) if b[1] == edge)
    lo, hi, k = schedule[i + 1] if schedule[i][2] == best_k else schedule[i]

    def stat(kk: int, c: int) -> LevelSpeedup | None:
        return LevelSpeedup(speedup=1.0, noise=0.0) if kk == 0 else k_stats.get(kk, {}).get(c)

    for c in sorted(k_stats.get(k, {}) if k else {c for st in k_stats.values() for c in st}):
        if not lo <= c <= hi:
            continue
        old, new = stat(k, c), stat(best_k, c)
        if old is None:
            continue
        if new is None or new.speedup < old.speedup * (1 - max(old.noise, new.noise)):
            return MergeCost(concurrency=c, k=k, speedup=round(old.speedup, 4),
                             merged_k=best_k,
                             merged_speedup=None if new is None else round(new.speedup, 4))
    return None


def merged_at_dips(schedule: Sequence[Band], edges: Sequence[EdgeCheck]) -> list[Band]:
    """The schedule with the two bands at every edge that dipped merged into one band of the
    K that measured better there (hysteresis by construction: no K flip is left where one
    cost throughput), unless the edge says the merge would give up a closed-loop gain
    (`gives_up`, merge_cost). Left to right, so K still never rises with load: each merged
    K lies between its neighbours'."""
    out = [list(b) for b in schedule]
    for edge in edges:
        if not edge.dips or edge.gives_up is not None or edge.best_k is None:
            continue
        i = next((i for i, b in enumerate(out[:-1]) if b[1] == edge.edge), None)
        if i is None:  # the edge was merged away already
            continue
        out[i:i + 2] = [[out[i][0], out[i + 1][1], edge.best_k]]
    merged: list[list[int]] = []
    for b in out:
        if merged and merged[-1][2] == b[2]:
            merged[-1][1] = b[1]
        else:
            merged.append(b)
    return [(s, e, k) for s, e, k in merged]


def with_open_loop(doc: PolicyDocument, edges: Sequence[EdgeCheck], static: TrialConfig, *,
                   varying_k: tuple[bool, str] | None = None) -> PolicyDocument:
    """The document with its open-loop check (`open_loop`: edges, dipped, the schedule as
    verified and as revised) and, where an edge dipped and the merge gives up no closed-loop
    gain (merge_cost; else the edge is kept, `kept_at`, with what it would give up under
    `gives_up`), the revised schedule in its place:
    `schedule`, `bands` and `speculative_config` (policy_config's of `static`, the config the
    schedule replaces, so one K left everywhere is a static config, and K 0 everywhere no
    speculation). The closed-loop verification stays, about the schedule it measured
    (`schedule_verified`)."""
    return doc.model_copy(update=open_loop_revision(doc.schedule, doc.k_stats, edges, static,
                                                    varying_k=varying_k))


def open_loop_revision(schedule: Sequence[Band] | None,
                       k_stats: dict[int, dict[int, LevelSpeedup]], edges: Sequence[EdgeCheck],
                       static: TrialConfig, *, varying_k: tuple[bool, str] | None = None
                       ) -> dict[str, Any]:
    """with_open_loop's fields of the document (of its `schedule` and `k_stats`), for the
    caller that builds it once."""
    before = [(s, e, k) for s, e, k in schedule or ()]
    edges = [e.model_copy(update={"gives_up": merge_cost(
        before, k_stats, edge=e.edge, best_k=e.best_k)})
        if e.dips and e.best_k is not None else e for e in edges]
    after = merged_at_dips(before, edges)
    revised = after != before
    block = OpenLoop(edges=tuple(edges), dipped_at=tuple(e.edge for e in edges if e.dips),
                     kept_at=tuple(e.edge for e in edges if e.dips and e.gives_up),
                     unmeasured_at=tuple(e.edge for e in edges if e.dips is None),
                     revised=revised, schedule_verified=tuple(before),
                     schedule_revised=tuple(after) if revised else None)
    if not revised:
        return {"open_loop": block}
    cfg = policy_config(static, after, varying_k=varying_k)
    return {"open_loop": block, "schedule": tuple(after), "bands": tuple(after),
            "speculative_config": None if cfg is None else cfg.speculative_config}


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def throughput_series(ladder_runs: Sequence[LadderRun], key: str,
                      metric: str = "output_throughput") -> dict[int, list[float]]:
    """{concurrency: [value per successful run]} for one config key; `metric`: a
    LevelMetrics field."""
    out: dict[int, list[float]] = {}
    for run in ladder_runs:
        if run.key != key or run.result is None:
            continue
        for lv in run.result.levels:
            out.setdefault(lv.concurrency, []).append(float(getattr(lv, metric)))
    return out


def drafts_series(ladder_runs: Sequence[LadderRun], key: str) -> dict[int, list[float]]:
    return throughput_series(ladder_runs, key, "spec_decode_num_drafts")


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
