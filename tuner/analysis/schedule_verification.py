"""Analysis stage, the policy's closed-loop verification: how the emitted schedule fared on
the ladder against the baseline and the static config it replaces, whether the engine honoured
it (drafts per level against the table) and ran the static config's engine path, and where it
was slower than its band's static K; where any of that failed, the schedule is withheld
(schedule_check_of) and the static K of the band that pays offered instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.analysis.ladder_stats import (
    drafts_series,
    engine_details,
    level_stats,
    loses,
    median_or_none,
    throughput_series,
)
from tuner.analysis.schedule import withheld
from tuner.records.configs import TrialConfig
from tuner.records.policy import (
    LadderRun,
    PathChange,
    PolicyDocument,
    ScheduleBasis,
    ScheduleCheck,
    ScheduleVerification,
    VerificationRow,
)


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


