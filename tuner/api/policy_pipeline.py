"""The load-aware policy as tuner.api runs it on a campaign (tuner.search.ladder.Campaign):
the study's leaders and the baseline measured on the ladder, the document drafted from those
runs, its schedule verified on the same ladder and, where the engine ran it, checked open
loop at each band edge; then the document completed once from what the launches found, and
worded (tuner.outputs.policy_words); `policy` is the command's entry (`tuner policy`, and
`tuner optimize --policy` after the search)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import checks, engine_cmdline
from tuner.api import engines, journal, study_outputs
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import PolicyOptions
from tuner.records.policy import LadderRun, PolicyContext, PolicyDocument
from tuner.records.trials import Role

Lineup = list[tuple[Role, TrialConfig]]
Say = Callable[[str], None]


def run(options: PolicyOptions, campaign: Any, *, workload: WorkloadSpec) -> PolicyDocument:
    """Measure the study's leading configs on the campaign's ladder, find where speculation
    stops paying, emit vLLM's per-batch-size schedule and verify it on the same ladder.
    `workload`: the study's, as the ladder sends it."""
    from tuner.analysis import frame, ladder_stats
    from tuner.analysis import policy as rules
    from tuner.outputs import policy_words
    from tuner.search import ladder, trials
    from tuner.speculative.schedule_rules import schedule_path, varying_k

    study, engine, say = campaign.study, campaign.engine, campaign.say
    levels = campaign.settings.concurrencies
    # The study's aligned baseline joins the ladder, so every speedup splits into the engine
    # path's cost and speculation's own gain (tuner.analysis.ladder_stats).
    lineup = rules.ladder_lineup(rules.leaders(frame.trials_frame(study), options.leaders),
                                 options.k_values, study=study.study_name,
                                 aligned=trials.aligned_config(study))
    say(f"Policy for study '{study.study_name}': ladder {','.join(map(str, levels))}, "
        f"{options.repeats} repeat(s), {len(lineup)} configs "
        f"({', '.join(c.label() for _, c in lineup)})")
    measure = functools.partial(ladder.measure, campaign)
    ladder_runs = measure(lineup=lineup, phase="ladder")
    leader = _leader(lineup)
    path = ladder_stats.engine_details(ladder_runs, leader.key())  # the path the bands were measured on
    draft = rules.draft_policy(
        ladder_runs, lineup, where=f"{campaign.out_dir}/policy",
        varying_k=varying_k(leader.method),
        path_rule=schedule_path(leader.method, runner=path.get("model_runner"),
                                cudagraph_mode=path.get("cudagraph_mode")),
        predicted=_predicted_curves(ladder_runs, leader, study_dir=campaign.out_dir,
                                    engine=engine, temperature=workload.temperature, say=say),
        max_batch=engine_cmdline.engine_limits(engine).max_num_seqs,
        context=PolicyContext(study=study.study_name, ladder=levels, repeats=options.repeats,
                              workload=workload.name, num_prompts=workload.num_prompts,
                              output_len=workload.output_len,
                              requests_per_slot=options.requests_per_slot))
    found = ({} if draft.speculative_config is None else
             _verified(draft, lineup, ladder_runs, measure=measure, campaign=campaign,
                       side_by_side=options.side_by_side))
    # The sentences the file, terminal and report show.
    return policy_words.worded(draft.model_copy(update=found))


def _leader(lineup: Lineup) -> TrialConfig:
    return next(c for role, c in lineup if role == Role.LEADER)


def _predicted_curves(ladder_runs: list[LadderRun], chosen: TrialConfig, *, study_dir: Path,
                      engine: EngineSpec, temperature: float,
                      say: Callable[[str], None]
                      ) -> dict[int, dict[int, float]] | None:
    """The replay's curves: every K of the `chosen` config the ladder did not measure, at the
    study's `temperature` (a sampled study's streams are never followed, as in predict)."""
    from tuner.search import k_curves

    predicted = k_curves.ladder_predictions(
        ladder_runs, chosen, study_dir=study_dir, limits=engine_cmdline.engine_limits(engine),
        temperature=temperature)
    if predicted:
        say(f"Replay predicted K 1-{max(predicted)} of {chosen.label()} on the ladder; the "
            "schedule may use a K the ladder did not measure and is verified by a launch; for "
            "a method that takes no changing K, a band's K only the replay predicted is named "
            "as such.")
    return predicted


def _verified(draft: PolicyDocument, lineup: Lineup, ladder_runs: list[LadderRun], *,
              measure: Callable[..., list[LadderRun]], campaign: Any, side_by_side: bool
              ) -> dict[str, Any]:
    """What the launches found, as the document's fields: its schedule measured on the same
    ladder (baseline and static come from the ladder phase unless `side_by_side` re-measures
    them interleaved with it), then, where the engine ran the schedule, the open-loop check
    (_open_loop_checked), and the serve command of the schedule that stands."""
    from tuner.analysis import policy as rules
    from tuner.analysis import schedule_verification
    from tuner.measure import enginepath

    policy_cfg, static = rules.policy_configs(draft, lineup)
    verify_lineup = [(Role.POLICY, policy_cfg)]
    if side_by_side:
        verify_lineup = [(Role.BASELINE, TrialConfig()), (Role.STATIC, static)] + verify_lineup
    verify_runs = measure(lineup=verify_lineup, phase="verify")
    found = schedule_verification.verified(
        draft, verify_runs if side_by_side else ladder_runs + verify_runs,
        policy_cfg=policy_cfg, static=static, side_by_side=side_by_side,
        path_fields=enginepath.FIELDS)
    ver = found["verification"]
    if not (ver.engine_rejected or not ver.honoured):
        found |= _open_loop_checked(found.get("schedule", draft.schedule), draft, verify_runs,
                                    policy_cfg=policy_cfg, static=static, campaign=campaign)
    spec = found.get("speculative_config", draft.speculative_config)
    engine = campaign.engine
    # One serve command, of the schedule as it stands after every check (withheld: none).
    return found | {"serve_note": engine_cmdline.serve_note(engine), "serve_command": (
        engine_cmdline.serve_command(engine, static.model_copy(
            update={"speculative_config": spec})) if spec else None)}


def _open_loop_checked(schedule: Any, draft: PolicyDocument, verify_runs: list[LadderRun], *,
                       policy_cfg: TrialConfig, static: TrialConfig, campaign: Any
                       ) -> dict[str, Any]:
    """The schedule and the static Ks of its bands measured open loop at each band edge
    (Poisson at the closed-loop request rate there, capped at the ladder level above it:
    vLLM keys the schedule on scheduled requests, prefills included, so such load swings K
    across the edge); bands merged where the schedule dipped beyond the spread."""
    from tuner.analysis import open_loop
    from tuner.analysis.ladder_stats import throughput_series
    from tuner.search import ladder

    plan = open_loop.open_loop_plan(schedule or (), throughput_series(
        verify_runs, policy_cfg.key(), "request_throughput"))
    if not plan:
        return {}
    lineup, static_keys = open_loop.open_loop_lineup(plan, policy_cfg, static)
    open_loop_runs = ladder.measure_open_loop(
        campaign, lineup=lineup, rates={e.concurrency: e.rate for e in plan})
    return open_loop.open_loop_revision(schedule, draft.k_stats, open_loop.open_loop_check(
        plan, open_loop_runs, policy_key=policy_cfg.key(), static_keys=static_keys), static)


@journal.one_driver
def policy(options: PolicyOptions, *, study_dir: Path, storage_url: str | None = None,
           study_name: str | None = None, say: Say = print) -> PolicyDocument:
    """Measure the study's leading configs on a concurrency ladder, find where speculation
    stops paying, emit vLLM's per-batch-size schedule and verify it on the same ladder.
    Returns the policy document (also written to policy.json)."""
    from tuner.outputs import files
    from tuner.search import ladder
    from tuner.search import study as st

    study = st.open_existing(study_dir, storage_url, study_name, write=True)
    stored = st.settings_of(study)
    updates = {k: v for k, v in (("num_prompts", options.num_prompts),
                                 ("output_len", options.output_len)) if v}
    wspec = stored.workload.model_copy(update=updates)
    settings = MeasureSettings(concurrencies=checks.ladder(options),
                               requests_per_slot=options.requests_per_slot)
    wl, schedule = engines.load_workload(wspec, stored.engine_spec, settings, say)
    campaign = ladder.Campaign(
        study=study, engine=stored.engine_spec, workload=wl, settings=settings,
        schedule=schedule, repeats=options.repeats, out_dir=study_dir, say=say)
    doc = run(options, campaign, workload=wspec)
    # The one place policy.json is written (tuner.outputs.report reads it back).
    files.write_json(study_dir / "policy.json", doc.model_dump())
    study_outputs.render(study, study_dir)  # the report shows the policy, and draws its plot
    return doc
