"""`tuner optimize` as tuner.api runs it: the plan resolved and checked, the space (its
drafter resolved, tuner.api.drafters), the workload, the study created or resumed, the search
(the replay strategy or Optuna), every K of a model-based drafter predicted, then (asked for)
the load-aware policy and the outputs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import checks, engine_cmdline
from tuner.api import drafters, engines, journal, policy_pipeline, study_outputs
from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec, RequestSchedule, Workload
from tuner.records.options import OptimizeOptions, OptimizePlan
from tuner.records.outcomes import StudyOutcome
from tuner.records.storage import StudySettings
from tuner.records.trials import Role

Say = Callable[[str], None]


def resolve_optimize(options: OptimizeOptions, *, engine: EngineSpec | None = None
                     ) -> OptimizePlan:
    """The plan of `options`: the engine resolved (or `engine`, one resolved already), every
    input checked and the defaults that follow from the engine filled in
    (tuner.checks.optimize_options)."""
    return checks.optimize_options(options, engine or engines.resolve_engine(options.engine))


@journal.one_driver
def optimize(options: OptimizeOptions, *, engine: EngineSpec | None = None, say: Say = print,
             detail: Say | None = None, show_bar: bool = False) -> Any:
    """Search the space; every trial is one engine launch measured at all levels. Returns the
    study (its storage holds every trial).

    strategy "replay" predicts every config from the baseline's tokens and launches only the
    calibration and the predicted leaders (tuner.search.replay_strategy); "optuna" samples
    configs with Optuna; "auto" replays when every method of the space can be replayed.
    aligned_baseline "auto" measures a baseline on the speculative trials' engine path once
    where it differs from the plain baseline's (tuner.search.loop SearchLoop.align).

    `say` prints what a user must know (the study, each finished trial, the decisions that
    change what is launched); `detail` (the CLI's -v) also the search's working, which the
    study folder keeps too (decisions.json, the report's "How it was decided"). `show_bar`: a
    bar over the trials (launches under replay) with elapsed time and ETA, for a TTY.
    `engine`: one resolved already (a scripted engine, a launcher of one's own) in place of
    `options.engine`."""
    from tuner.outputs import console, decisions
    from tuner.search import executors, loop

    plan = resolve_optimize(options, engine=engine)
    engine = plan.engine
    space, use_replay = _space(options, engine)
    wl, schedule = engines.load_workload(options.workload, engine, options.settings, say,
                                         sample=True)
    study, retry = _create_study(plan, space, wl, schedule, use_replay=use_replay, say=say)
    engines.warn_sampling(engine, options.workload, say)
    executor = executors.choose(engine, ray_address=options.ray_address,
                                parallel=options.parallel, logical_gpus=options.logical_gpus)
    _say_resumed(study, plan, use_replay=use_replay, say=say)
    bar = console.TrialProgress(say=say, show_bar=show_bar,
                                desc="launches" if use_replay else "trials",
                                unit="launch" if use_replay else "trial")
    shown_detail = functools.partial(bar.write, detail) if detail else None
    narrator = decisions.Narrator(plan.out_dir, say=bar.say, detail=shown_detail,
                                  trial_line=console.trial_line)
    output = loop.LoopOutput(  # lines print above the bar
        record=narrator, say=bar.say, tick=bar.update, show_bar=show_bar,
        detail=shown_detail, note=narrator.note)
    search = loop.SearchLoop(
        plan=plan, study=study, space=space, workload=wl, schedule=schedule,
        executor=executor,
        gpus=executors.gpus_per_trial(engine, asked=options.gpus_per_trial,
                                      logical_gpus=options.logical_gpus), output=output)
    try:
        _run_search(search, options, plan.out_dir, retry, use_replay=use_replay)
    finally:
        bar.close()
        executor.shutdown()
    return study


def _space(options: OptimizeOptions, engine: EngineSpec) -> tuple[Any, bool]:
    """The search space, checked against the strategy, the objectives and this machine; and
    whether the replay strategy runs it."""
    from tuner.outputs import decision_words
    from tuner.search import candidates, samplers
    from tuner.search import space as spaces

    # Whether the replay can run a space depends on its methods, not on its drafter: that
    # refusal comes first, before the drafter is resolved against the target.
    space = spaces.load(options.space_name)
    refused = candidates.why_not_replayable(space, rates=options.acceptance_rates)
    if options.strategy == "replay" and refused:
        raise ConfigError(f"--strategy replay: {decision_words.unreplayable_text(refused)}. "
                          "Use --strategy optuna (or auto, which picks it) for this space.")
    space = drafters.drafted_space(space, engine, options.draft_model)
    samplers.validate_objectives(options.objectives)
    checks.check_methods(space, engine)
    return space, options.strategy == "replay" or (options.strategy == "auto" and not refused)


def _create_study(plan: OptimizePlan, space: Any, wl: Workload,
                  schedule: RequestSchedule, *, use_replay: bool, say: Say
                  ) -> tuple[Any, list[dict]]:
    """The study, created (or resumed) once every input has passed, and announced; with the
    params of the trials a dead driver left, to be tried again."""
    from tuner.measure import machine
    from tuner.search import loop, outcomes, samplers
    from tuner.search import study as st

    o, engine = plan.options, plan.engine
    settings = StudySettings(
        workload=o.workload, workload_digest=wl.digest, engine_spec=engine, settings=o.settings,
        space=space.name, drafters=drafters.space_drafters(space),
        objectives=tuple(o.objectives),
        target_concurrency=plan.target_concurrency, constraints=dict(o.constraints),
        acceptance_profile=o.acceptance_rates, metadata=dict(o.metadata),
        confidence=o.confidence, margin=o.margin, schedule=schedule,
        fingerprint=machine.fingerprint(engine, o.workload, wl.digest))
    constrained = any(v is not None for v in o.constraints.values())
    sampler = samplers.make_sampler(o.sampler, seed=o.seed, constrained=constrained)
    # Every input is checked by now: only now is the study folder made (a resumed study's
    # settings checked against this command's), and announced.
    study = st.create(out_dir=plan.out_dir, name=plan.study_name, objectives=list(o.objectives),
                      sampler=sampler, storage_url=o.storage_url, settings=settings)
    say(f"Study '{plan.study_name}' in {plan.out_dir}: space {space.name}, strategy "
        f"{'replay' if use_replay else 'optuna/' + o.sampler}, {o.n_trials} trials, concurrency "
        f"{','.join(map(str, o.settings.concurrencies))} (objectives at "
        f"c={plan.target_concurrency}: {', '.join(o.objectives)}); every launch sends the same "
        f"{_levels_text(schedule)}")
    retry = outcomes.recover_orphans(study)
    if retry:
        say(f"Resuming: {len(retry)} trial(s) interrupted by a dead driver will be retried.")
    if not use_replay:
        loop.enqueue_start(study, space, o.sampler, retry)
    return study, retry


def _levels_text(schedule: RequestSchedule) -> str:
    """ "17 requests (c=1: 1 warm-up + 4, c=4: 4 + 8), no prompt twice" """
    parts = [f"c={lv.concurrency}: {len(lv.warmups)}{' warm-up' if i == 0 else ''} + "
             f"{len(lv.measured)}" for i, lv in enumerate(schedule.levels)]
    twice = "prompts may repeat" if schedule.allow_repeats else "no prompt twice"
    return f"{schedule.requests} requests ({', '.join(parts)}), {twice}"


def _say_resumed(study: Any, plan: OptimizePlan, *, use_replay: bool, say: Say) -> None:
    from tuner.search import study as st

    # What --n-trials counts: engine launches under replay (repeats included), trials else.
    done = st.counted_trials(study, repeats=use_replay)
    if done:
        say(f"Resuming study '{plan.study_name}': {done} of {plan.options.n_trials} "
            f"{'engine launches' if use_replay else 'trials'} already done.")


def _run_search(search: Any, options: OptimizeOptions, out_dir: Path, retry: list[dict], *,
                use_replay: bool) -> None:
    """The replay strategy where it runs (the Optuna search where it cannot go on), else the
    Optuna search; then the leaders' repeats."""
    from tuner.outputs import ranking, selection
    from tuner.search import loop, replay_strategy, strategy

    if use_replay:
        search.say(f"Strategy replay: --n-trials {options.n_trials} engine launches at most.")
        replay = replay_strategy.ReplaySearch(
            study_dir=out_dir, leaders=options.confirm_leaders, seed=options.seed or 0,
            confidence=options.confidence, margin=options.margin,
            limits=engine_cmdline.engine_limits(search.engine),
            watch=replay_strategy.Watch(
                prediction=lambda pred: _write_predictions(pred, out_dir),
                selection=selection.watcher(search.record)))
        stop = search.run(replay, n_trials=options.n_trials, timeout_s=options.timeout_s)
        if stop.ranking is not None:
            ranking.say_ranking(stop.ranking, say=search.say, detail=search.detail,
                                note=search.note)
        if stop.reason != strategy.StopReason.NO_TOKENS:
            return
        loop.enqueue_start(search.study, search.space, options.sampler, retry)
    search.run(n_trials=options.n_trials, timeout_s=options.timeout_s)
    if options.repeats > 1:
        search.repeat_leaders(repeats=options.repeats)
    _predict_drafters(search, out_dir)


def _predict_drafters(search: Any, out_dir: Path) -> None:
    """After a search that launched a model-based drafter (draft_model, EAGLE, MTP): every K
    up to each drafter's largest launched K, at every level, from that launch's per-position
    acceptance (tuner.replay.drafter_k) into predicted.csv, its table and any miss said."""
    from tuner.outputs import drafter_k as drafter_words
    from tuner.replay import drafter_k
    from tuner.replay.predict import predict as predict_space
    from tuner.search import study as st
    from tuner.search import trials
    from tuner.speculative.schedule_rules import autoregressive_drafter

    if not any(autoregressive_drafter(m)
               for m in search.space.speculative_methods()):
        return
    measured = trials.measured_trials(search.study, out_dir)
    base = next((t for t in measured if t.role == Role.BASELINE and t.capture is not None),
                None)
    if base is None:
        return
    limits = engine_cmdline.engine_limits(search.engine)
    pred = predict_space(base.capture, [], measured, max_model_len=limits.max_model_len,
                         max_num_seqs=limits.max_num_seqs,
                         temperature=search.workload.spec.temperature)
    if not pred.drafters:
        return
    _write_predictions(pred, out_dir)
    search.say(drafter_words.axes_text(pred.drafters))
    stored = st.settings_of(search.study)
    seen = {(m.key, m.concurrency) for m in stored.prediction_misses}
    fresh = [m for ax in pred.drafters for m in drafter_k.prediction_misses(ax)
             if (m.key, m.concurrency) not in seen]
    if fresh:  # kept where the recommendation that rests on the launch reads it
        st.store_settings(search.study, stored.model_copy(
            update={"prediction_misses": (*stored.prediction_misses, *fresh)}))


def _write_predictions(pred: Any, out_dir: Path) -> None:
    from tuner.outputs import predictions

    predictions.write_predictions(pred.rows, out_dir)


def optimize_and_report(options: OptimizeOptions, *, engine: EngineSpec | None = None,
                        say: Say = print, detail: Say | None = None, show_bar: bool = False
                        ) -> StudyOutcome:
    """`tuner optimize`: the search, then (asked for, and when the study has a baseline to
    compare with) the load-aware policy, then the outputs; partial results render too."""
    from tuner.outputs import decision_words
    from tuner.search import study as st

    plan = resolve_optimize(options, engine=engine)  # the study's folder, for what follows
    study = optimize(options, engine=plan.engine, say=say, detail=detail, show_bar=show_bar)
    out_dir = plan.out_dir
    found = st.failure_summary(study, out_dir)
    failed = None if found is None else decision_words.no_answer_text(found)
    doc = None
    if options.policy is not None and failed is None:
        doc = policy_pipeline.policy(options.policy, study_dir=out_dir,
                                     storage_url=options.storage_url,
                                     study_name=study.study_name, say=say)
    paths, recs = study_outputs.render(study, out_dir) if options.report else ({}, [])
    return StudyOutcome(study_name=study.study_name, out_dir=out_dir, failed=failed,
                        paths=paths, recommendations=tuple(recs), policy=doc)
