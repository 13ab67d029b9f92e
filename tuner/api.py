"""The orchestrator: each command is a straight list of stage calls.

workload -> search space -> trial config -> engine -> load -> metrics -> storage -> analysis
-> outputs. The stages (measure, search, analysis, outputs) never call each other's steps in
sequence; only this module does. Inputs arrive checked (tuner.checks); what each function
returns is a record or a path the CLI prints.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import engine_cmdline
from tuner.errors import ConfigError
from tuner.records import (
    AlignedBaseline,
    BenchResult,
    EngineSpec,
    MeasureSettings,
    Recommendation,
    StudyOutcome,
    TrialConfig,
    WorkloadSpec,
)

Say = Callable[[str], None]


def _one_driver(fn):
    """The decorated call is a driver: a study it opens for writing stays locked until the call
    returns (tuner.search.storage), so two drivers never write one study."""

    @functools.wraps(fn)
    def as_driver(**kwargs):
        from tuner.search import storage

        with storage.driver(say=kwargs.get("say", print)):
            return fn(**kwargs)

    return as_driver


def _load_workload(workload: WorkloadSpec, engine: EngineSpec, settings: MeasureSettings,
                   say: Say):
    from tuner.measure import workloads

    return workloads.load(workload, tokenizer=engine.tokenizer or engine.model,
                          pool=settings.pool_size(workload.num_prompts),
                          max_model_len=engine_cmdline.engine_setting(engine, "max_model_len"),
                          say=say)


# --- bench: one config, one launch ----------------------------------------------------------
def bench(
    *, workload: WorkloadSpec, engine: EngineSpec, config: TrialConfig,
    settings: MeasureSettings, out_dir: Path, show_bar: bool = False, say: Say = print,
    metadata: dict[str, str] | None = None,
) -> BenchResult:
    """Measure one speculative config at every requested concurrency in one engine launch.
    `metadata` (`--metadata KEY=VALUE`) is kept in result.json for the user's records.
    With `engine.base_url` the server already runs: measured as it is, with its own config."""
    from tuner.measure import trial
    from tuner.outputs import files

    if engine.base_url and config != TrialConfig():
        raise ConfigError(f"--base-url {engine.base_url} with --speculative-config (or "
                          f"--acceptance-profile): a running server keeps the config it was "
                          f"started with. Drop them to measure it as it is, or drop --base-url "
                          f"to let the tuner launch vLLM with this config.")
    wl = _load_workload(workload, engine, settings, say)
    out_dir.mkdir(parents=True, exist_ok=True)
    what = (f"the live server at {engine.base_url} (its own config)" if engine.base_url
            else config.label())
    levels = settings.concurrencies
    requests = _per_level([settings.requests_for(c, workload.num_prompts) for c in levels],
                          "request")
    warmups = _per_level([settings.warmups_for(c) for c in levels], "warm-up")
    # The pool holds every level's requests and warm-ups (no prompt twice in one engine).
    say(f"Benchmarking {what} on {Path(engine.model).name}, workload {workload.name} "
        f"({len(wl.prompts)} prompts drawn: {requests} and {warmups} per level), "
        f"concurrency {','.join(map(str, levels))}")
    t0 = time.monotonic()
    result = trial.measure(engine, config, wl, settings, trial_dir=out_dir,
                           progress=lambda m: say("  " + m), show_bar=show_bar)
    files.write_bench_result(out_dir, result, engine=engine, metadata=metadata, header={
        "workload": workload.model_dump(), "workload_digest": wl.digest,
        "settings": settings.model_dump(), "engine_spec": engine.model_dump(),
        "wall_s": round(time.monotonic() - t0, 1), "metadata": metadata or {}})
    return result


def _per_level(counts: list[int], noun: str) -> str:
    """Counts per concurrency level as the banner lists them: "1 warm-up", "4 requests",
    "4,8 requests" (one number when all levels agree)."""
    text = str(counts[0]) if len(set(counts)) == 1 else ",".join(map(str, counts))
    return f"{text} {noun}" + ("" if text == "1" else "s")


# --- optimize: the Optuna search ------------------------------------------------------------
@_one_driver
def optimize(
    *, workload: WorkloadSpec, engine: EngineSpec, space_name: str, settings: MeasureSettings,
    out_dir: Path, study_name: str, n_trials: int, timeout_s: float | None = None,
    sampler: str = "tpe", seed: int | None = 0, objectives: list[str],
    target_concurrency: int, constraints: dict, storage_url: str | None = None,
    ray_address: str | None = None, parallel: int | None = None, repeats: int = 1,
    gpus_per_trial: float | None = None, logical_gpus: int | None = None,
    acceptance_rates: list[float] | None = None, aligned_baseline: AlignedBaseline = "auto",
    strategy: str = "auto", confirm_leaders: int = 2, show_bar: bool = False, say: Say = print,
    metadata: dict[str, str] | None = None, detail: Say | None = None,
):
    """Search the space; every trial is one engine launch measured at all levels. Returns the
    study (its storage holds every trial). `show_bar`: a bar over the trials (launches under
    replay) with elapsed time and ETA, for a TTY.

    strategy "replay" predicts every config from the baseline's tokens and launches only the
    calibration and the predicted leaders (tuner.search.replay_strategy); "optuna" samples configs
    with Optuna; "auto" replays when every method of the space can be replayed.

    aligned_baseline "auto" compares the first speculative trial's engine path with the plain
    baseline's and, where they differ, measures a baseline on the speculative path once
    (repeated beside the plain one); "off" never does; a TrialConfig is that baseline as given
    (tuner.search.loop SearchLoop.align).

    `say` prints what a user must know (the study, each finished trial, the decisions that
    change what is launched); `detail` (the CLI's -v) also the search's working: each trial's
    engine start and levels, the step-cost fit, the token streams, the grid climb. Those facts
    are also kept in the study folder (decisions.json) for the report's "How it was decided"."""
    from tuner import checks
    from tuner.measure import model
    from tuner.outputs import console, decisions
    from tuner.search import executors, loop, replay_strategy
    from tuner.search import space as spaces
    from tuner.search import study as st

    if engine.base_url:
        raise ConfigError(f"--base-url {engine.base_url}: a study launches one engine per "
                          f"config, so it cannot use a server that is already running. Measure "
                          f"that server with `tuner bench --base-url`, or drop --base-url.")
    sp = spaces.load(space_name)
    replay_refused = replay_strategy.why_not_replayable(sp, rates=acceptance_rates)
    if strategy == "replay" and replay_refused:
        raise ConfigError(f"--strategy replay: {replay_refused}. Use --strategy optuna (or "
                          "auto, which picks it) for this space.")
    use_replay = strategy == "replay" or (strategy == "auto" and replay_refused is None)
    st.validate_objectives(objectives)
    checks.target_concurrency(target_concurrency, settings.concurrencies)
    checks.check_methods(sp, engine)
    wl = _load_workload(workload, engine, settings, say)
    attrs = {"workload": workload.model_dump(), "workload_digest": wl.digest,
             "engine_spec": engine.model_dump(), "settings": settings.model_dump(),
             "space": sp.name, "objectives": objectives,
             "target_concurrency": target_concurrency, "constraints": constraints,
             "acceptance_profile": acceptance_rates, "metadata": metadata or {},
             "fingerprint": model.fingerprint(engine, workload, wl.digest)}
    constrained = any(v is not None for v in constraints.values())
    optuna_sampler = st.make_sampler(sampler, seed=seed, constrained=constrained)
    # Every input is checked by now: only now is the study folder made and announced.
    say(f"Study '{study_name}' in {out_dir}: space {sp.name}, strategy "
        f"{'replay' if use_replay else 'optuna/' + sampler}, {n_trials} trials, concurrency "
        f"{','.join(map(str, settings.concurrencies))} (objectives at c={target_concurrency}: "
        f"{', '.join(objectives)})")
    study = st.create(out_dir=out_dir, name=study_name, objectives=objectives,
                      sampler=optuna_sampler, storage_url=storage_url, settings=attrs)
    retry = st.recover_orphans(study)
    if retry:
        say(f"Resuming: {len(retry)} trial(s) interrupted by a dead driver will be retried.")
    if not use_replay:
        loop.enqueue_start(study, sp, sampler, retry)
    executor = executors.choose(engine, ray_address=ray_address, parallel=parallel,
                                logical_gpus=logical_gpus)
    gpus = gpus_per_trial if gpus_per_trial is not None else (
        float(engine_cmdline.gpus_per_engine(engine)) if engine.device == "cuda" or logical_gpus
        else 0.0)
    # What --n-trials counts: engine launches under replay (repeats included), trials else.
    done_before = st.counted_trials(study, repeats=use_replay)
    if done_before:
        say(f"Resuming study '{study_name}': {done_before} of {n_trials} "
            f"{'engine launches' if use_replay else 'trials'} already done.")
    bar = console.TrialProgress(say=say, show_bar=show_bar,
                                desc="launches" if use_replay else "trials",
                                unit="launch" if use_replay else "trial")
    say = bar.say  # lines print above the bar
    detail = functools.partial(bar.write, detail) if detail else None
    search = loop.SearchLoop(
        study=study, space=sp, engine=engine, workload=wl, settings=settings, out_dir=out_dir,
        objectives=objectives, target=target_concurrency, constraints=constraints,
        executor=executor, gpus=gpus, say=say, line=console.trial_line, rates=acceptance_rates,
        tick=bar.update, show_bar=show_bar, aligned=aligned_baseline, detail=detail,
        note=decisions.Decisions(out_dir).record)
    try:
        replayed = False
        if use_replay:
            say(f"Strategy replay: --n-trials {n_trials} engine launches at most.")
            replay = replay_strategy.ReplaySearch(
                search, study_dir=out_dir, leaders=confirm_leaders, seed=seed or 0,
                max_model_len=engine_cmdline.engine_setting(engine, "max_model_len") or 1 << 30,
                max_num_seqs=engine_cmdline.engine_setting(engine, "max_num_seqs") or 256,
                on_prediction=lambda pred: _write_predictions(pred, out_dir))
            replayed = replay.run(n_trials=n_trials, timeout_s=timeout_s)
            if not replayed:
                loop.enqueue_start(study, sp, sampler, retry)
        if not replayed:
            search.run(n_trials=n_trials, timeout_s=timeout_s)
            if repeats > 1:
                search.repeat_leaders(repeats=repeats)
    finally:
        bar.close()
        executor.shutdown()
    return study


def _write_predictions(pred: Any, out_dir: Path) -> None:
    from tuner.outputs import report as outputs

    outputs.write_predictions(pred.rows, out_dir)


def optimize_and_report(*, policy_options: dict[str, Any] | None = None, report: bool = True,
                        **options: Any) -> StudyOutcome:
    """`tuner optimize`: the search, then (asked for, and when the study has a baseline to
    compare with) the load-aware policy, then the outputs; partial results render too."""
    from tuner.search import study as st

    study = optimize(**options)
    out_dir, say = options["out_dir"], options.get("say", print)
    failed = st.failure_summary(study, out_dir)
    doc = None
    if policy_options is not None and failed is None:
        doc = policy(study_dir=out_dir, storage_url=options.get("storage_url"),
                     study_name=study.study_name, say=say, **policy_options)
    paths, recs = _render(study, out_dir) if report else ({}, [])
    return StudyOutcome(study_name=study.study_name, out_dir=out_dir, failed=failed,
                        paths=paths, recommendations=tuple(recs), policy=doc)


# --- policy: the load-aware schedule, measured and verified ---------------------------------
@_one_driver
def policy(
    *, study_dir: Path, storage_url: str | None = None, study_name: str | None = None,
    ladder: tuple[int, ...] | None = None, max_concurrency: int | None = None,
    repeats: int = 2, leaders: int = 2, k_values: tuple[int, ...] | None = None,
    num_prompts: int | None = None, output_len: int | None = None,
    max_batch: int | None = None, side_by_side: bool = False, requests_per_slot: int = 4,
    say: Say = print,
) -> dict:
    """Measure the study's leading configs on a concurrency ladder, find where speculation
    stops paying, emit vLLM's per-batch-size schedule and verify it on the same ladder.
    Returns the policy document (also written to policy.json)."""
    from tuner import checks
    from tuner.analysis import frame
    from tuner.analysis import policy as rules
    from tuner.outputs import files
    from tuner.search import ladder as ladder_runs
    from tuner.search import loop, replay_strategy
    from tuner.search import study as st

    study = st.open_existing(study_dir, storage_url, study_name, setup=True, write=True)
    meta = study.user_attrs.get(st.ATTR) or {}
    engine = EngineSpec.model_validate(meta["engine_spec"])
    updates = {k: v for k, v in (("num_prompts", num_prompts), ("output_len", output_len)) if v}
    wspec = WorkloadSpec.model_validate(meta["workload"]).model_copy(update=updates)
    ladder = checks.ladder(ladder=ladder, max_concurrency=max_concurrency)
    ladder_settings = MeasureSettings(concurrencies=ladder, requests_per_slot=requests_per_slot)
    wl = _load_workload(wspec, engine, ladder_settings, say)
    # The study's aligned baseline joins the ladder, so every speedup splits into the engine
    # path's cost and speculation's own gain (tuner.analysis.policy).
    runs = rules.ladder_runs(rules.leaders(frame.trials_frame(study), leaders), k_values,
                             study=study.study_name, aligned=loop.aligned_config(study))
    say(f"Policy for study '{study.study_name}': ladder {','.join(map(str, ladder))}, "
        f"{repeats} repeat(s), {len(runs)} configs ({', '.join(c.label() for _, c in runs)})")
    measure = functools.partial(ladder_runs.measure, study=study, engine=engine, workload=wl,
                                ladder=ladder, repeats=repeats, out_dir=study_dir,
                                requests_per_slot=requests_per_slot, say=say)
    measured = measure(runs=runs, phase="ladder")
    chosen = next(c for role, c in runs if role == "leader")
    # The replay's curves add every K of the chosen config the ladder did not measure.
    predicted = replay_strategy.ladder_predictions(
        measured, chosen, study_dir=study_dir,
        max_model_len=engine_cmdline.engine_setting(engine, "max_model_len") or 1 << 30,
        max_num_seqs=engine_cmdline.engine_setting(engine, "max_num_seqs") or 256)
    if predicted:
        say(f"Replay predicted K 1-{max(predicted)} of {chosen.label()} on the ladder; the "
            "schedule may use a K the ladder did not measure, and is verified either way.")
    doc = rules.draft_policy(
        measured, runs, where=f"{study_dir}/policy", predicted=predicted,
        max_batch=max_batch or engine_cmdline.engine_setting(engine, "max_num_seqs") or rules.MAX_BATCH,
        context={"study": study.study_name, "ladder": list(ladder), "repeats": repeats,
                 "workload": wspec.name, "num_prompts": wspec.num_prompts,
                 "output_len": wspec.output_len, "requests_per_slot": requests_per_slot})
    if doc["speculative_config"] is not None:
        policy_cfg, static = rules.policy_configs(doc, runs)
        doc["serve_command"] = engine_cmdline.serve_command(engine, policy_cfg)
        # The policy is measured on the same ladder; baseline and static come from the ladder
        # phase unless side_by_side asks to re-measure them interleaved with the policy.
        verify_runs = [("policy", policy_cfg)]
        if side_by_side:
            verify_runs = [("baseline", TrialConfig()), ("static", static)] + verify_runs
        verify = measure(runs=verify_runs, phase="verify")
        doc = rules.with_verification(doc, verify if side_by_side else measured + verify,
                                      policy_cfg=policy_cfg, static=static,
                                      side_by_side=side_by_side)
    files.write_json(study_dir / "policy.json", doc)
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
    from tuner.analysis import frame, pareto, recommend
    from tuner.outputs import report as outputs

    df = pareto.speedups(frame.trials_frame(study))
    recs = recommend.recommendations(df)
    paths = outputs.write_outputs(
        study_name=study.study_name, df=df, configs=pareto.speedups(frame.configs_frame(df)),
        recs=recs, out_dir=out_dir)
    return paths, recs


def recommend(*, study_dir: Path, storage_url: str | None = None,
              study_name: str | None = None, concurrency: int | None = None,
              max_tpot_ms: float | None = None, max_ttft_ms: float | None = None
              ) -> Recommendation:
    """The recommendation for one level (default: the first), with the study's SLOs unless
    given here."""
    from tuner.analysis import frame
    from tuner.analysis import recommend as rec
    from tuner.search import study as st

    study = st.open_existing(study_dir, storage_url, study_name)
    df = frame.trials_frame(study)
    levels = frame.levels_of(df)
    c = concurrency or (levels[0] if levels else None)
    if c is None or c not in levels:
        raise ConfigError(f"--concurrency {c}: the study measured "
                          f"{', '.join(map(str, levels)) or 'no levels yet'}. Pick one of those.")
    meta = df.attrs.get("tuner", {})
    slos = meta.get("constraints") or {}
    return rec.recommend(
        df, concurrency=c, meta=meta,
        max_tpot_ms=max_tpot_ms if max_tpot_ms is not None else slos.get("max_tpot_ms"),
        max_ttft_ms=max_ttft_ms if max_ttft_ms is not None else slos.get("max_ttft_ms"))


def predict(*, study_dir: Path, storage_url: str | None = None, study_name: str | None = None,
            space_name: str | None = None, concurrency: tuple[int, ...] | None = None,
            say: Say = print) -> Any:
    """The predicted table of a space (default: the study's) from a study whose baseline holds
    token ids, calibrated on the study's measured trials; no engine, nothing written.
    Returns a tuner.replay.predict.Prediction."""
    from tuner.replay.predict import Prediction
    from tuner.replay.predict import predict as predict_space
    from tuner.search import replay_strategy
    from tuner.search import space as spaces
    from tuner.search import study as st

    study = st.open_existing(study_dir, storage_url, study_name)
    meta = study.user_attrs.get(st.ATTR) or {}
    engine = EngineSpec.model_validate(meta["engine_spec"])
    sp = spaces.load(space_name or meta.get("space") or "default")
    base = next((t for t in replay_strategy.measured_trials(study, study_dir)
                 if t.role == "baseline" and t.capture is not None), None)
    if base is None:
        raise ConfigError(f"{study_dir}: no completed baseline with token ids. Studies measured "
                          "before token capture (or on a vLLM that does not return token ids) "
                          "cannot be replayed; run `tuner optimize` again with a new "
                          "--study-name to measure one.")
    levels = base.capture.levels()
    if concurrency and set(concurrency) - set(levels):
        raise ConfigError(f"--concurrency {','.join(map(str, concurrency))}: the baseline's "
                          f"tokens were captured at {','.join(map(str, levels))}. Pick among "
                          "those.")
    configs = replay_strategy.candidates(sp)
    say(f"Replaying {len(configs)} configs of space '{sp.name}' over trial {base.number}'s "
        f"tokens ...")
    measured = replay_strategy.measured_trials(study, study_dir)
    memo: dict = {}
    max_model_len = engine_cmdline.engine_setting(engine, "max_model_len") or 1 << 30
    max_num_seqs = engine_cmdline.engine_setting(engine, "max_num_seqs") or 256

    def run(cands: list[TrialConfig]) -> Prediction:
        return predict_space(base.capture, cands, measured, max_model_len=max_model_len,
                             max_num_seqs=max_num_seqs, memo=memo,
                             levels=list(concurrency) if concurrency else levels)

    t0 = time.monotonic()
    configs, pred, added = replay_strategy.refine(sp, configs, run(configs), run,
                                          limit=replay_strategy.refine_limit(base.capture))
    if added:
        say(f"Searched the sampled grids around the predicted leaders: {added} more configs "
            f"replayed ({len(configs)} in all).")
    return dataclasses.replace(pred, seconds=time.monotonic() - t0)


@_one_driver
def repair(*, study_dir: Path, say: Say = print) -> str:
    """Quarantine the bad lines of a study's journal, keep every good record, check it loads."""
    from tuner.search import storage

    return storage.repair(study_dir)

