"""The orchestrator: each command is a straight list of stage calls taking one options record.

options -> engine resolved, inputs checked -> workload -> search space -> trial config ->
engine -> load -> metrics -> storage -> analysis -> outputs. The stages (measure, search,
analysis, outputs) never call each other's steps in sequence; only this module does. Each
command first resolves its options record (the user's engine into an EngineSpec, the defaults
that follow from it) and checks it (tuner.checks), before anything is printed or created;
what each function returns is a record or a path the CLI prints.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import checks, engine_cmdline
from tuner.api import policy_pipeline
from tuner.errors import ConfigError
from tuner.records.configs import (
    EngineSpec,
    MeasureSettings,
    RequestSchedule,
    TrialConfig,
    Workload,
    WorkloadSpec,
)
from tuner.records.options import (
    BenchOptions,
    EngineOptions,
    OptimizeOptions,
    OptimizePlan,
    PolicyOptions,
    TrafficOptions,
    VerifyOptions,
)
from tuner.records.outcomes import StudyOutcome, TrafficOutcome
from tuner.records.policy import PolicyDocument
from tuner.records.results import BenchResult, Recommendation, Role
from tuner.records.storage import StudySettings
from tuner.records.verification import Verification, VerifyLaunch

Say = Callable[[str], None]
_log = logging.getLogger(__name__)


def _one_driver(fn):
    """The decorated call is a driver: a study it opens for writing stays locked until the call
    returns (tuner.search.storage), so two drivers never write one study."""

    @functools.wraps(fn)
    def as_driver(*args, **kwargs):
        from tuner.search import storage

        with storage.driver(say=kwargs.get("say", print)):
            return fn(*args, **kwargs)

    return as_driver


# --- what the CLI lists, and what it asks after an interrupt --------------------------------
def names() -> dict[str, tuple[str, ...]]:
    """The valid names `--help` lists where the value is checked later (with a message that
    says what to do) rather than by argparse's `choices`: spaces, samplers, objectives."""
    from tuner.measure.metrics import OBJECTIVES
    from tuner.search.samplers import SAMPLERS
    from tuner.search.space import available

    return {"spaces": tuple(available()), "samplers": tuple(SAMPLERS),
            "objectives": tuple(OBJECTIVES)}


def live_engines() -> list[int]:
    """The process groups of this process's engines still running (tuner.measure.engine)."""
    from tuner.measure import engine

    return list(engine.live_engines())


# --- the engine: the user's model, or the embedded default on this machine ------------------
def resolve_engine(engine: EngineOptions) -> EngineSpec:
    """The engine to launch (or, with `base_url`, the server already running) on this
    machine: the user's model, or the embedded default with the CPU engine's flags where
    there is no GPU."""
    from tuner.measure import machine
    from tuner.measure import model as embedded

    if engine.base_url is not None:
        checks.live_engine_options(engine)
        spec = machine.live_engine(engine.base_url, model=engine.model,
                                   tokenizer=engine.tokenizer,
                                   request_timeout_s=engine.request_timeout_s,
                                   level_timeout_s=engine.level_timeout_s)
    else:
        spec = checks.engine_spec(
            engine, gpu=machine.has_nvidia_gpu(),
            embedded_model=None if engine.model else str(embedded.embedded_model_dir()))
    _log.debug("engine: model %s, command %s, args %s, env %s, device %s", spec.model,
               " ".join(spec.vllm_cmd) or "(default)", " ".join(spec.extra_args) or "none",
               spec.env or "none", spec.device)
    return spec


def _load_workload(workload: WorkloadSpec, engine: EngineSpec, settings: MeasureSettings,
                   say: Say, *, sample: bool = False) -> tuple[Workload, RequestSchedule]:
    """The prompts (as many as the levels, their warm-ups and the workload sample ask for,
    where the data holds them) and the request schedule every launch sends
    (tuner.measure.request_schedule), with the workload sample a study's first baseline also
    sends where `sample`; said once, up front, where levels are shortened, prompts repeat or
    the sample is short."""
    from tuner.measure import request_schedule, workloads

    wl = workloads.load(workload, tokenizer=engine.tokenizer or engine.model,
                        pool=settings.pool_size(workload.num_prompts),
                        max_model_len=engine_cmdline.engine_limits(engine).max_model_len,
                        say=say)
    schedule, note = request_schedule.build(wl, settings)
    for line in (note, request_schedule.sample_note(wl, schedule, settings) if sample else None):
        if line:
            say(line)
    return wl, schedule if sample else schedule.without_sample()


# --- bench: one config, one launch ----------------------------------------------------------
def bench(options: BenchOptions, *, engine: EngineSpec | None = None, say: Say = print,
          show_bar: bool = False) -> BenchResult:
    """Measure one speculative config at every requested concurrency in one engine launch.
    With `base_url` the server already runs: measured as it is, with its own config.
    `engine`: one resolved already (a scripted engine, a launcher of one's own) in place of
    `options.engine`. `show_bar`: a bar over each level's requests, for a TTY."""
    from tuner.measure import trial
    from tuner.outputs import files
    from tuner.records.results import BenchHeader

    engine = engine or resolve_engine(options.engine)
    checks.bench_options(options, engine)
    workload, settings, out_dir = options.workload, options.settings, options.out_dir
    wl, schedule = _load_workload(workload, engine, settings, say)
    out_dir.mkdir(parents=True, exist_ok=True)
    what = (f"the live server at {engine.base_url} (its own config)" if engine.base_url
            else options.config.label())
    if options.config.speculative_config:
        _warn_sampling(engine, workload, say)
    levels = settings.concurrencies
    requests = _per_level([len(schedule.level(c).measured) for c in levels], "request")
    warmups = _per_level([len(schedule.level(c).warmups) for c in levels], "warm-up")
    say(f"Benchmarking {what} on {Path(engine.model).name}, workload {workload.name} "
        f"({schedule.requests} distinct prompts: {requests} and {warmups} per level), "
        f"concurrency {','.join(map(str, levels))}")
    t0 = time.monotonic()
    result = trial.measure(engine, options.config, wl, settings, trial_dir=out_dir,
                           schedule=schedule, progress=lambda m: say("  " + m), show_bar=show_bar)
    files.write_bench_result(out_dir, result, header=BenchHeader(
        workload=workload, workload_digest=wl.digest, settings=settings, schedule=schedule,
        engine_spec=engine, wall_s=round(time.monotonic() - t0, 1),
        metadata=dict(options.metadata)))
    return result


def _warn_sampling(engine: EngineSpec, workload: WorkloadSpec, say: Say) -> None:
    """Once, up front: speculative launches on vLLM's CPU build sample wrongly at temperature
    above 0 (tuner.replay.sampling.known_defect)."""
    from tuner.replay import sampling
    from tuner.speculative import vllm_version

    if not engine.base_url and (text := sampling.known_defect(
            device=engine.device, temperature=workload.temperature,
            version=None if engine.vllm_cmd else vllm_version())):
        say(text)


def _levels_text(schedule: RequestSchedule) -> str:
    """ "17 requests (c=1: 1 warm-up + 4, c=4: 4 + 8), no prompt twice" """
    parts = [f"c={lv.concurrency}: {len(lv.warmups)}{' warm-up' if i == 0 else ''} + "
             f"{len(lv.measured)}" for i, lv in enumerate(schedule.levels)]
    twice = "prompts may repeat" if schedule.allow_repeats else "no prompt twice"
    return f"{schedule.requests} requests ({', '.join(parts)}), {twice}"


def _per_level(counts: list[int], noun: str) -> str:
    """Counts per concurrency level as the banner lists them: "1 warm-up", "4 requests",
    "4,8 requests" (one number when all levels agree)."""
    text = str(counts[0]) if len(set(counts)) == 1 else ",".join(map(str, counts))
    return f"{text} {noun}" + ("" if text == "1" else "s")


# --- optimize: the search -------------------------------------------------------------------
def resolve_optimize(options: OptimizeOptions, *, engine: EngineSpec | None = None
                     ) -> OptimizePlan:
    """The plan of `options`: the engine resolved (or `engine`, one resolved already), every
    input checked and the defaults that follow from the engine filled in
    (tuner.checks.optimize_options)."""
    return checks.optimize_options(options, engine or resolve_engine(options.engine))


@_one_driver
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
    wl, schedule = _load_workload(options.workload, engine, options.settings, say, sample=True)
    study, retry = _create_study(plan, space, wl, schedule, use_replay=use_replay, say=say)
    _warn_sampling(engine, options.workload, say)
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
                          "Use --strategy optuna (or "
                          "auto, which picks it) for this space.")
    space = drafted_space(space, engine, options.draft_model)
    samplers.validate_objectives(options.objectives)
    checks.check_methods(space, engine)
    return space, options.strategy == "replay" or (options.strategy == "auto" and not refused)


def _with_drafter(space: Any, model: str, *, replacing: str | None = None) -> Any:
    """`space` with `model` as the drafter (`model`) of every method that loads one; with
    `replacing`, only of those that name that one."""
    methods = {m: ({**p, "model": model} if m in checks.NEEDS_MODEL and
                   (replacing is None or p.get("model") == replacing) else p)
               for m, p in space.methods.items()}
    return space.model_copy(update={"methods": methods})


def drafted_space(space: Any, engine: EngineSpec, draft_model: str | None) -> Any:
    """`space` with its drafter resolved: `draft_model` (--draft-model, checked against the
    target's tokenizer) for every method that loads one; else, where the space names the
    embedded default's made drafter (checks.EMBEDDED_DRAFT), that drafter's folder, built on
    first use, which only the embedded default target may take."""
    from tuner.measure import model as embedded
    from tuner.measure import workloads

    named = {m: p.get("model") for m, p in space.methods.items() if m in checks.NEEDS_MODEL}
    if draft_model is not None:
        if not named:
            raise ConfigError(f"--draft-model: search space '{space.name}' has no method that "
                              f"loads a drafter ({', '.join(sorted(checks.NEEDS_MODEL))}). Use "
                              f"--space draft, or drop --draft-model.")
        target = engine.tokenizer or engine.model
        checks.draft_vocabulary(draft_model, workloads.vocabulary(draft_model, what="drafter"),
                                workloads.vocabulary(target, what="target", config=engine.model),
                                target_name=engine.model_name or engine.model)
        return _with_drafter(space, draft_model)
    if checks.EMBEDDED_DRAFT not in named.values():
        return space
    if not engine_cmdline.embedded_default(engine):
        method = next(m for m, d in named.items() if d == checks.EMBEDDED_DRAFT)
        name = engine.model_name or engine.model
        raise ConfigError(
            f"Search space '{space.name}': methods.{method}.model is {checks.EMBEDDED_DRAFT}, "
            f"the drafter made for the embedded default model, and the target is {name}, "
            f"whose tokenizer it does not share. Pass --draft-model PATH, a small model with "
            f"{name}'s tokenizer.")
    return _with_drafter(space, str(embedded.embedded_draft_dir()),
                                  replacing=checks.EMBEDDED_DRAFT)


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
        space=space.name, objectives=tuple(o.objectives),
        target_concurrency=plan.target_concurrency, constraints=dict(o.constraints),
        acceptance_profile=o.acceptance_rates, metadata=dict(o.metadata),
        confidence=o.confidence, margin=o.margin, schedule=schedule,
        fingerprint=machine.fingerprint(engine, o.workload, wl.digest))
    constrained = any(v is not None for v in o.constraints.values())
    sampler = samplers.make_sampler(o.sampler, seed=o.seed, constrained=constrained)
    # Every input is checked by now: only now is the study folder made and announced.
    say(f"Study '{plan.study_name}' in {plan.out_dir}: space {space.name}, strategy "
        f"{'replay' if use_replay else 'optuna/' + o.sampler}, {o.n_trials} trials, concurrency "
        f"{','.join(map(str, o.settings.concurrencies))} (objectives at "
        f"c={plan.target_concurrency}: {', '.join(o.objectives)}); every launch sends the same "
        f"{_levels_text(schedule)}")
    study = st.create(out_dir=plan.out_dir, name=plan.study_name, objectives=list(o.objectives),
                      sampler=sampler, storage_url=o.storage_url, settings=settings)
    retry = outcomes.recover_orphans(study)
    if retry:
        say(f"Resuming: {len(retry)} trial(s) interrupted by a dead driver will be retried.")
    if not use_replay:
        loop.enqueue_start(study, space, o.sampler, retry)
    return study, retry


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
    from tuner import speculative
    from tuner.outputs import drafter_k as drafter_words
    from tuner.replay import drafter_k
    from tuner.replay.predict import predict as predict_space
    from tuner.search import study as st
    from tuner.search import trials

    if not any(speculative.autoregressive_drafter(m)
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
        doc = policy(options.policy, study_dir=out_dir, storage_url=options.storage_url,
                     study_name=study.study_name, say=say)
    paths, recs = _render(study, out_dir) if options.report else ({}, [])
    return StudyOutcome(study_name=study.study_name, out_dir=out_dir, failed=failed,
                        paths=paths, recommendations=tuple(recs), policy=doc)


# --- policy: the load-aware schedule, measured and verified (tuner.api.policy_pipeline) ----
@_one_driver
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
    wl, schedule = _load_workload(wspec, stored.engine_spec, settings, say)
    campaign = ladder.Campaign(
        study=study, engine=stored.engine_spec, workload=wl, settings=settings,
        schedule=schedule, repeats=options.repeats, out_dir=study_dir, say=say)
    doc = policy_pipeline.run(options, campaign, workload=wspec)
    # The one place policy.json is written (tuner.outputs.report reads it back).
    files.write_json(study_dir / "policy.json", doc.model_dump())
    _render(study, study_dir)  # the report shows the policy, and draws its plot
    return doc


# --- report and recommend: regenerated from storage, no engine ------------------------------
def write_report(study: Any, out_dir: Path) -> dict[str, Path]:
    """Analyse an open study as stored and write every output: report.html/.md, trials.csv,
    trials_raw.csv, recommendation.json, plots. Returns {name: path}."""
    return _render(study, out_dir)[0]


def report(*, study_dir: Path, storage_url: str | None = None, study_name: str | None = None
           ) -> tuple[dict[str, Path], list[Recommendation]]:
    """Re-render a study's outputs from its storage; returns the written paths and one
    recommendation per level."""
    from tuner.search import study as st

    return _render(st.open_existing(study_dir, storage_url, study_name), study_dir)


def _render(study: Any, out_dir: Path) -> tuple[dict[str, Path], list[Recommendation]]:
    from tuner.analysis import frame, pareto
    from tuner.outputs import report as outputs
    from tuner.search import study as st

    settings = st.settings_of(study)
    df = pareto.speedups(frame.trials_frame(study))
    recs = _recommendations(study, df, settings)
    paths = outputs.write_outputs(
        study_name=study.study_name, df=df, configs=pareto.speedups(frame.configs_frame(df)),
        points=pareto.points(df), recs=recs, out_dir=out_dir, settings=settings)
    return paths, recs


def _recommendations(study: Any, df: Any, settings: StudySettings) -> list[Recommendation]:
    """Every level's answer as the study stands: its selections where the replay decided on a
    workload sample, its measured trials elsewhere (tuner.analysis.recommend)."""
    from tuner.analysis import recommend
    from tuner.search import study as st

    return recommend.recommendations(df, settings, st.selections_of(study))


def recommend(*, study_dir: Path, storage_url: str | None = None,
              study_name: str | None = None, level: int | None = None,
              max_tpot_ms: float | None = None, max_ttft_ms: float | None = None
              ) -> Recommendation:
    """The recommendation for one level (default: the first), with the study's SLOs unless
    given here."""
    from tuner.analysis import frame
    from tuner.analysis import recommend as rec
    from tuner.search import study as st

    study = st.open_existing(study_dir, storage_url, study_name)
    settings = st.settings_of(study)
    df = frame.trials_frame(study)
    levels = frame.levels_of(df)
    c = level or (levels[0] if levels else None)
    if c is None or c not in levels:
        raise ConfigError(f"--level {c}: the study measured "
                          f"{', '.join(map(str, levels)) or 'no levels yet'}. Pick one of those.")
    slos = settings.constraints
    chosen = {s.concurrency: s for s in st.selections_of(study)}.get(c)
    if chosen is not None and max_tpot_ms is None and max_ttft_ms is None and not any(
            v is not None for v in slos.values()):
        answer = rec.selected(df, chosen, settings=settings)
        if answer is not None:
            return answer
    return rec.recommend(
        df, concurrency=c, settings=settings,
        max_tpot_ms=max_tpot_ms if max_tpot_ms is not None else slos.get("max_tpot_ms"),
        max_ttft_ms=max_ttft_ms if max_ttft_ms is not None else slos.get("max_ttft_ms"))


# --- verify: the study's answer measured again, out of sample -------------------------------
def verify(options: VerifyOptions, *, say: Say = print) -> Verification:
    """Launch, interleaved, the plain baseline and each level's checked config (the
    recommended one; where speculation stays off, the fastest the verdict names)
    `options.launches` times each, on the study's engine and workload but only prompts the
    study never sent, every launch the same requests (tuner.measure.request_schedule.fresh);
    per level, whether the speedup measured falls inside the interval the study stated
    (tuner.analysis.verification). Writes verify.json and each launch's folder under
    STUDY/verify/; the study's own storage is only read."""
    from tuner.analysis import verification as checking
    from tuner.outputs import verification as words
    from tuner.search import study as st

    t0 = time.monotonic()
    study_dir = options.study_dir
    study = st.open_existing(study_dir, options.storage_url, options.study_name)
    stored = st.settings_of(study, where=str(study_dir))
    targets = _verify_targets(study, stored, study_dir)
    subjects = checking.subjects(targets)
    pool, excluded, schedule = _fresh_schedule(stored, study_dir, options.num_prompts, say=say)
    for t in targets:
        if t.skip is not None:
            say(words.skip_line(t))
    say(words.plan_line(study=study.study_name, schedule=schedule, excluded=len(excluded),
                        pool=len(pool.prompts), launches=options.launches,
                        subjects=len(subjects)))
    if note := words.shortened_line(schedule):
        say(note)
    _warn_sampling(stored.engine_spec, stored.workload, say)
    settings = stored.settings.model_copy(
        update={"concurrencies": tuple(lv.concurrency for lv in schedule.levels)})
    lineup = [("baseline", TrialConfig())] + [("subject", c) for c in subjects]
    launches: list[VerifyLaunch] = []
    for round_ in range(1, options.launches + 1):
        for role, config in lineup:
            launches.append(_verify_launch(
                VerifyLaunch(number=len(launches), round=round_, role=role, config=config,
                             label=config.label()),
                engine=stored.engine_spec, pool=pool, settings=settings, schedule=schedule,
                study_dir=study_dir))
            say(words.launch_line(launches[-1], options.launches * len(lineup)))
    levels = tuple(checking.check(t, launches, requests=len(lv.measured), asked=lv.asked)
                   for t in targets for lv in [schedule.level(t.concurrency)])
    result = Verification(study=study.study_name, study_dir=str(study_dir),
                          workload=stored.workload.name, launches_per_config=options.launches,
                          pool_prompts=len(pool.prompts), excluded_prompts=len(excluded),
                          schedule=schedule, levels=levels, launches=tuple(launches),
                          wall_s=round(time.monotonic() - t0, 1))
    words.write(result, study_dir)
    return result


def _verify_targets(study: Any, stored: StudySettings, study_dir: Path) -> tuple[Any, ...]:
    """Each level's target, computed as `tuner report` computes the recommendations; a study
    with none to check is refused."""
    from tuner.analysis import frame, pareto
    from tuner.analysis import verification as checking

    df = pareto.speedups(frame.trials_frame(study))
    targets = checking.targets(df, _recommendations(study, df, stored))
    if not checking.subjects(targets):
        raise ConfigError(_nothing_to_verify(study_dir, targets))
    if stored.schedule is None:
        raise ConfigError(f"{study_dir}: the study was stored before request schedules, so "
                          f"which prompts it sent is not known and none can be left out. Run "
                          f"`tuner optimize` again with a new --study-name to check one.")
    return targets


def _fresh_schedule(stored: StudySettings, study_dir: Path, num_prompts: int | None, *,
                    say: Say) -> tuple[Workload, frozenset[int], RequestSchedule]:
    """The pool of prompts, the indices in it the study sent, and the schedule every launch
    of the check sends: the study's levels and counts (`num_prompts` measured requests per
    level instead, where given) over the others."""
    from tuner.measure import request_schedule

    like = stored.schedule
    if like is None:  # _verify_targets refused it
        raise ConfigError(f"{study_dir}: the study has no request schedule.")
    requests = sum(len(lv.warmups) + (num_prompts or len(lv.measured)) for lv in like.levels)
    pool, excluded = _fresh_pool(stored, like, requests=requests, say=say)
    return pool, excluded, request_schedule.fresh(pool, like, exclude=excluded,
                                                  measured=num_prompts)


def _nothing_to_verify(study_dir: Path, targets: Any) -> str:
    levels = ", ".join(f"c={t.concurrency}" for t in targets) or "none"
    return (f"{study_dir}: no level has a recommendation with a speedup interval to check "
            f"(levels: {levels}). An interval needs the baseline and a speculative config "
            f"launched, with a between-launch spread to go on: run `tuner optimize` on the "
            f"study again with a larger --n-trials (or --repeats 2), then verify.")


def _fresh_pool(stored: StudySettings, schedule: RequestSchedule, *, requests: int, say: Say
                ) -> tuple[Workload, frozenset[int]]:
    """The study's workload with room for `requests` fresh ones, and the indices of its
    prompts the study sent. The pool is drawn as the study drew its prompts, only longer, so
    the study's are its first ones; they are matched by text (a random workload draws other
    prompts for another count: there the study's are drawn again at its own count)."""
    from tuner.measure import request_schedule, workloads
    from tuner.records.configs import prompts_digest

    engine = stored.engine_spec
    tokenizer = engine.tokenizer or engine.model
    max_model_len = engine_cmdline.engine_limits(engine).max_model_len
    used = request_schedule.used(schedule)
    study_pool = stored.settings.pool_size(stored.workload.num_prompts)
    pool = workloads.load(stored.workload, tokenizer=tokenizer,
                          pool=max(study_pool, max(used, default=-1) + 1) + requests,
                          max_model_len=max_model_len, say=say)
    # The study's own count first: the one prefix to hash unless the study drew another.
    lengths = [study_pool, *range(len(pool.prompts), max(used, default=-1), -1)]
    found = next((n for n in lengths if n <= len(pool.prompts)
                  and prompts_digest(pool.prompts[:n]) == schedule.workload_digest), None)
    sent = pool.model_copy(update={"prompts": pool.prompts[:found]}) if found is not None else \
        workloads.load(stored.workload, tokenizer=tokenizer, pool=study_pool,
                       max_model_len=max_model_len)
    if sent.digest != schedule.workload_digest:
        raise ConfigError(
            f"The study's workload '{stored.workload.name}' no longer gives the prompts it "
            f"sent (digest {sent.digest}, stored {schedule.workload_digest}): its dataset file "
            f"or the tokenizer changed. Verify with the data and model the study ran on.")
    return pool, request_schedule.sent_before(pool, sent, schedule)


def _verify_launch(launch: VerifyLaunch, *, engine: EngineSpec, pool: Workload,
                   settings: MeasureSettings, schedule: RequestSchedule, study_dir: Path
                   ) -> VerifyLaunch:
    """`launch` measured, the path `tuner bench` measures by, its files in
    STUDY/verify/<number>; an engine that fails is recorded in it, and the check goes on."""
    from tuner.errors import TrialFailed
    from tuner.measure import trial

    try:
        result = trial.measure(engine, launch.config, pool, settings,
                               trial_dir=study_dir / "verify" / str(launch.number),
                               schedule=schedule)
    except TrialFailed as e:
        return launch.model_copy(update={"failure": trial.failure_of(e)})
    return launch.model_copy(update={
        "throughputs": {lv.concurrency: lv.output_throughput for lv in result.levels},
        "engine_start_s": result.engine.start_s if result.engine.launched else None})


def predict(*, study_dir: Path, storage_url: str | None = None, study_name: str | None = None,
            space_name: str | None = None, levels: tuple[int, ...] | None = None,
            say: Say = print) -> Any:
    """The predicted table of a space (default: the study's) from a study whose baseline holds
    token ids, calibrated on the study's measured trials; no engine, nothing written.
    Returns a tuner.replay.predict.Prediction."""
    from tuner.replay.predict import Prediction
    from tuner.replay.predict import predict as predict_space
    from tuner.search import candidates, trials
    from tuner.search import space as spaces
    from tuner.search import study as st

    study = st.open_existing(study_dir, storage_url, study_name)
    stored = st.settings_of(study)
    engine = stored.engine_spec
    sp = spaces.load(space_name or stored.space)
    base = next((t for t in trials.measured_trials(study, study_dir)
                 if t.role == Role.BASELINE and t.capture is not None), None)
    if base is None:
        raise ConfigError(f"{study_dir}: no completed baseline with token ids. Studies measured "
                          "before token capture (or on a vLLM that does not return token ids) "
                          "cannot be replayed; run `tuner optimize` again with a new "
                          "--study-name to measure one.")
    captured = base.capture.levels()
    if levels and set(levels) - set(captured):
        raise ConfigError(f"--levels {','.join(map(str, levels))}: the baseline's tokens were "
                          f"captured at {','.join(map(str, captured))}. Pick among those.")
    configs = candidates.candidates(sp)
    say(f"Replaying {len(configs)} configs of space '{sp.name}' over trial {base.number}'s "
        f"tokens ...")
    measured = trials.measured_trials(study, study_dir)
    memo: dict = {}
    limits = engine_cmdline.engine_limits(engine)
    temperature = stored.workload.temperature

    def run(cands: list[TrialConfig]) -> Prediction:
        return predict_space(base.capture, cands, measured, max_model_len=limits.max_model_len,
                             max_num_seqs=limits.max_num_seqs, memo=memo,
                             levels=list(levels or captured), temperature=temperature)

    t0 = time.monotonic()
    configs, pred, added = candidates.refine(sp, configs, run(configs), run,
                                          limit=candidates.refine_limit(base.capture))
    if added:
        say(f"Searched the sampled grids around the predicted leaders: {added} more configs "
            f"replayed ({len(configs)} in all).")
    return dataclasses.replace(pred, seconds=time.monotonic() - t0)


def predict_traffic(options: TrafficOptions, *, say: Say = print) -> TrafficOutcome:
    """A space's acceptance over a user's own request logs (tuner.replay.traffic) at each
    level, a closed loop of c; with a study on the target hardware, also throughput, TPOT and
    speedup on its step cost. Writes traffic.csv and traffic.json; no engine."""
    from tuner.outputs import traffic as traffic_out
    from tuner.replay import traffic
    from tuner.replay.traffic import prompts
    from tuner.search import candidates
    from tuner.search import space as spaces

    levels = list(options.levels or (1,))
    sp = spaces.load(options.space_name or "ngram")
    cal, engine = _traffic_study(options, levels) if options.study_dir else (None, None)
    limits = engine_cmdline.engine_limits(engine) if engine else None
    say(f"Reading {options.traffic_path} ...")
    logs = traffic.read(options.traffic_path, tokenizer_for=_traffic_tokenizer,
                        model=options.model or _study_model(engine),
                        max_model_len=limits.max_model_len if limits else None,
                        context_of=prompts.context_len)
    configs = candidates.candidates(sp)
    say(f"Replaying {len(configs)} configs of space '{sp.name}' over {len(logs)} requests at "
        f"c={','.join(map(str, levels))} ...")
    pred = traffic.predict(logs, configs, levels=levels, max_model_len=logs.max_model_len,
                           max_num_seqs=limits.max_num_seqs if limits else
                           engine_cmdline.VLLM_DEFAULT_LIMITS["cuda"][0], calibration=cal)
    header = {"traffic": str(options.traffic_path), "requests": len(logs), "model": logs.model,
              "space": sp.name, "levels": levels, "study": pred.study,
              "max_model_len": logs.max_model_len, "skipped_records": dict(logs.skipped),
              "notes": pred.notes(), "seconds": round(pred.seconds, 3)}
    paths = traffic_out.write(pred.rows, header, options.out_dir or Path("outputs") /
                              f"traffic-{_traffic_stem(options.traffic_path)}")
    return TrafficOutcome(table=traffic_out.table(pred.rows, top=options.top, levels=levels),
                          notes=tuple(pred.notes()), rows=tuple(pred.rows), paths=paths,
                          requests=len(logs), configs=pred.configs, seconds=pred.seconds)


def _traffic_study(options: TrafficOptions, levels: list[int]) -> tuple[Any, EngineSpec]:
    """The study that prices a traffic: its step cost, fitted as `tuner predict` fits it on
    its measured trials (tuner.replay.predict with no config to predict), and its engine."""
    from tuner.replay.predict import predict as predict_space
    from tuner.replay.traffic import price
    from tuner.search import study as st
    from tuner.search import trials

    study = st.open_existing(options.study_dir, options.storage_url, options.study_name)
    engine = st.settings_of(study).engine_spec
    measured = trials.measured_trials(study, options.study_dir)
    base = next((t for t in measured if t.role == Role.BASELINE and t.capture is not None), None)
    if base is None:
        raise ConfigError(f"--study {options.study_dir}: no completed baseline with token ids, "
                          f"so no step cost to price the traffic on. Drop --study for "
                          f"acceptance only, or pass a study measured with token capture.")
    limits = engine_cmdline.engine_limits(engine)
    fitted = predict_space(base.capture, [], measured, max_model_len=limits.max_model_len,
                           max_num_seqs=limits.max_num_seqs,
                           levels=[c for c in levels if c in base.capture.levels()])
    return price.Calibration(costs=fitted.costs, base=base.capture, measured=measured,
                             max_num_seqs=limits.max_num_seqs,
                             study=str(options.study_dir)), engine


def _study_model(engine: EngineSpec | None) -> str | None:
    """The model (or tokenizer) a study's engine ran: None for none or the embedded default."""
    if engine is None or engine_cmdline.embedded_default(engine):
        return None
    return engine.tokenizer or engine.model


def _traffic_tokenizer(name: str | None) -> Any:
    """The tokenizer of `name` (a model, its folder or its tokenizer's), the embedded default's
    for None or its hub id."""
    from tuner.measure import model as embedded
    from tuner.measure import workloads

    if name is None or name in (engine_cmdline.EMBEDDED_HUB_ID, embedded.EMBEDDED_NAME):
        return workloads.load_tokenizer(workloads.EMBEDDED_TOKENIZER)
    try:
        return workloads.load_tokenizer(name)
    except ConfigError as e:
        cause = str(e).split(" Pass --tokenizer")[0]
        raise ConfigError(f"{cause} Pass --model with the model's folder or its tokenizer's "
                          f"(tokenizer.json, tokenizer_config.json), or a hub id this machine "
                          f"has cached.") from None


def _traffic_stem(path: Path) -> str:
    """requests.jsonl.xz -> requests: the name of a traffic file without its suffixes."""
    name = Path(path).name
    for suffix in (".gz", ".xz", ".jsonl", ".ndjson", ".json", ".parquet"):
        name = name.removesuffix(suffix)
    return name or "file"


@_one_driver
def repair(*, study_dir: Path, say: Say = print) -> str:
    """Quarantine the bad lines of a study's journal, keep every good record, check it loads."""
    from tuner.outputs import journal_repair
    from tuner.search import repair as journal

    return journal_repair.repair_text(journal.repair(study_dir))

