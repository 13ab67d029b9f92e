"""`tuner verify` as tuner.api runs it: a study's answer launched again, interleaved with
the baseline, on prompts the study never sent; per level, whether the measured speedup falls
inside the interval the study stated."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import engine_cmdline
from tuner.api import engines, study_outputs
from tuner.errors import ConfigError
from tuner.records.configs import (
    EngineSpec,
    MeasureSettings,
    RequestSchedule,
    TrialConfig,
    Workload,
)
from tuner.records.options import VerifyOptions
from tuner.records.storage import StudySettings
from tuner.records.verification import Verification, VerifyLaunch

Say = Callable[[str], None]


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
    engines.warn_sampling(stored.engine_spec, stored.workload, say)
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
    _learn_spread(stored, study_dir, launches)
    result = Verification(study=study.study_name, study_dir=str(study_dir),
                          workload=stored.workload.name, launches_per_config=options.launches,
                          pool_prompts=len(pool.prompts), excluded_prompts=len(excluded),
                          schedule=schedule, levels=levels, launches=tuple(launches),
                          wall_s=round(time.monotonic() - t0, 1))
    words.write(result, study_dir)
    return result


def _learn_spread(stored: StudySettings, study_dir: Path, launches: list[VerifyLaunch]) -> None:
    """The check's repeats (every config launched `--launches` times on the same requests)
    feed the host's noise profile as a study's do, under the check's own entry: the studies
    that follow start from the spread this host has shown in every repeat it ran."""
    from tuner import intervals
    from tuner.search import noise_profile

    by_level: dict[int, dict[str, list[float]]] = {}
    for launch in launches:
        for c, tps in launch.throughputs.items():
            by_level.setdefault(c, {}).setdefault(launch.config.key(), []).append(tps)
    machine = noise_profile.machine_key(stored)
    for c, runs in sorted(by_level.items()):
        noise_profile.record(machine, c, study=str((study_dir / "verify").resolve()),
                             pool=intervals.Pool.of(runs.values()))


def _verify_targets(study: Any, stored: StudySettings, study_dir: Path) -> tuple[Any, ...]:
    """Each level's target, computed as `tuner report` computes the recommendations; a study
    with none to check is refused."""
    from tuner.analysis import frame, pareto
    from tuner.analysis import verification as checking

    df = pareto.speedups(frame.trials_frame(study))
    targets = checking.targets(df, study_outputs.recommendations(study, df, stored))
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
