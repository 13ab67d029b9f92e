"""Study stage: the Optuna study is the single truth about trials.

Promises: storage in the study folder by default (a journal file, readable by
optuna-dashboard, its values named after the objectives) or any Optuna RDB URL; the study's
settings checked when it resumes; the one reader of a trial's raw attrs (`stored` parses them
once into a StoredTrial); duplicate configs, and configs the engine refused at start, are
found in storage (tuner.search.outcomes answers them and writes every outcome); a trial's
token capture is kept in its folder and named in its attrs. Nothing here starts an engine.
"""

from __future__ import annotations

import json
import re
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import tokens
from tuner.errors import ConfigError
from tuner.measure.metrics import OBJECTIVES
from tuner.records.configs import EngineSpec, RequestSchedule, TrialConfig
from tuner.records.decisions import NoAnswer
from tuner.records.policy import LadderRun
from tuner.records.results import BenchResult
from tuner.records.selection import Selection
from tuner.records.storage import (
    SELECTIONS_ATTR,
    STUDY_ATTR,
    StoredTrial,
    StudySettings,
    TrialAttr,
)
from tuner.records.trials import Failure, Role

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial


def storage(out_dir: Path, url: str | None = None, *, write: bool = False) -> Any:
    """The study's storage (tuner.search.storage checks the journal). `write`: this driver writes the
    study, so it holds the study lock; readers never change the journal."""
    from tuner.search import storage as store

    if url:
        if "://" not in url:
            raise ConfigError(f"--storage '{url}' is not an Optuna storage URL. Examples: "
                              f"sqlite:///study.db, postgresql://user@host/db; omit it to "
                              f"store in the study folder.")
        return store.open_rdb(url)
    if write:
        return store.open_journal(out_dir, write=True)  # creates the folder under the lock
    out_dir.mkdir(parents=True, exist_ok=True)
    return store.open_journal(out_dir)


def open_existing(out_dir: Path, url: str | None = None, name: str | None = None, *,
                  write: bool = False) -> Any:
    """Load a spec-tuner study; the study folder alone is enough. Another tool's study, or one
    whose settings cannot be read, is refused before anything is written there; `write`: lock
    it for this driver (see storage)."""
    import optuna

    if url is None and not (out_dir / "study.journal").exists():
        raise ConfigError(f"No study in '{out_dir}' (no study.journal). Pass the folder that "
                          f"`tuner optimize` printed, e.g. outputs/instructcoder-smollm2.")
    st = storage(out_dir, url)
    names = optuna.get_all_study_names(st)
    where = f"the storage {url}" if url else f"'{out_dir}'"
    if not names:
        raise ConfigError(f"The storage of '{out_dir}' holds no study yet.")
    if name is None:
        name = names[0]
    elif name not in names:
        raise ConfigError(f"No study named '{name}' in the storage. Available: {', '.join(names)}.")
    study = optuna.load_study(study_name=name, storage=st)
    if not isinstance(study.user_attrs.get(STUDY_ATTR), dict):
        raise ConfigError(
            f"Study '{name}' in {where} is not a spec-tuner study (no '{STUDY_ATTR}' settings): "
            f"another tool's Optuna study, or a `tuner optimize` stopped before storing its "
            f"setup. Nothing was written there. Pass a folder made by `tuner optimize`, e.g. "
            f"outputs/instructcoder-smollm2.")
    settings_of(study, where=where)  # readable, or one clear refusal
    if write:
        study = optuna.load_study(study_name=name, storage=storage(out_dir, url, write=True))
    return study


def constraint_values(trial: Any) -> list[float]:
    """A trial's stored SLO constraints as Optuna's constrained samplers take them (<= 0: met;
    none stored: met)."""
    return list(trial.user_attrs.get(TrialAttr.CONSTRAINT, [0.0]))


def create(
    *, out_dir: Path, name: str, objectives: list[str], sampler: Any,
    storage_url: str | None, settings: StudySettings,
) -> Any:
    """Create the study or load it to resume; refuse to resume with different settings."""
    import warnings

    import optuna

    directions = [OBJECTIVES[o][0] for o in objectives]
    study = optuna.create_study(study_name=name, storage=storage(out_dir, storage_url,
                                                                 write=True),
                                directions=directions, sampler=sampler, load_if_exists=True)
    if study.user_attrs.get(STUDY_ATTR) is None:
        store_settings(study, settings)
    else:
        old = settings_of(study, where=str(out_dir))
        pairs = [("objectives", old.objectives, settings.objectives),
                 ("workload_digest", old.workload_digest, settings.workload_digest),
                 ("target_concurrency", old.target_concurrency, settings.target_concurrency),
                 # The sampling belongs to the workload: a study at other sampling is another.
                 ("sampling", old.workload.sampling, settings.workload.sampling)]
        for key, was, asked in pairs:
            if was != asked:
                raise ConfigError(
                    f"Study '{name}' in {out_dir} was started with {key}={was!r}, this "
                    f"command asks for {asked!r}. Resume with the same options, or "
                    f"pass --study-name NEW (or another --output-dir) to start a new study.")
        _same_schedule(name, out_dir, old.schedule, settings.schedule)
        _same_drafters(name, out_dir, old.drafters, settings.drafters)
        # The latest command's SLOs, measurement and decision rule (--confidence, --margin)
        # are what the report renders; a study stored before schedules takes this one's; a
        # method's drafter first launched now (another space) joins the study's.
        store_settings(study, old.model_copy(update={
            "constraints": settings.constraints, "settings": settings.settings,
            "confidence": settings.confidence, "margin": settings.margin,
            "schedule": old.schedule or settings.schedule,
            "drafters": {**settings.drafters, **old.drafters}}))
    # Named values: optuna-dashboard and Optuna's plots then say "output_throughput" where they
    # said "Objective 0". A study stored before this line gets its names when it resumes.
    if study.metric_names != objectives:
        with warnings.catch_warnings():  # "experimental" (Optuna 3.2+) tells a user nothing
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(objectives))
    return study


def settings_of(study: Any, *, where: str | None = None) -> StudySettings:
    """The study's settings (StudySettings), the one reader of its STUDY_ATTR; a study whose
    settings cannot be read is one clear refusal."""
    from pydantic import ValidationError

    try:
        return StudySettings.model_validate(study.user_attrs.get(STUDY_ATTR))
    except ValidationError as e:
        name = f"Study '{study.study_name}'{f' in {where}' if where else ''}"
        missing = [str(err["loc"][0]) for err in e.errors()
                   if err["type"] == "missing" and len(err["loc"]) == 1]
        if missing:
            raise ConfigError(
                f"{name} has no finished setup (its settings lack {', '.join(missing)}): "
                f"`tuner optimize` stopped before storing them. Run `tuner optimize` for this "
                f"study first; the report, recommend, predict and policy start from its "
                f"settings.") from None
        fields = sorted({str(err["loc"][0]) for err in e.errors() if err["loc"]})
        raise ConfigError(
            f"{name} has settings this spec-tuner cannot read (at {', '.join(fields)}): "
            f"another version wrote them. Run `tuner optimize` with --study-name NEW for a "
            f"new study.") from None


def store_settings(study: Any, settings: StudySettings) -> None:
    """Write the study's settings (the one writer of its STUDY_ATTR)."""
    study.set_user_attr(STUDY_ATTR, settings.stored())


def store_selections(study: Any, selections: Sequence[Selection]) -> None:
    """Write the selection of every level (the one writer of SELECTIONS_ATTR)."""
    study.set_user_attr(SELECTIONS_ATTR, [s.model_dump(mode="json") for s in selections])


def selections_of(study: Any) -> tuple[Selection, ...]:
    """The stored selections (tuner.replay.selection); () where the study has none or an
    entry cannot be read."""
    raw = study.user_attrs.get(SELECTIONS_ATTR)
    if not isinstance(raw, list):
        return ()
    try:
        return tuple(Selection.model_validate(s) for s in raw)
    except ValueError:
        return ()


def _same_schedule(name: str, out_dir: Path, was: RequestSchedule | None,
                   asked: RequestSchedule | None) -> None:
    """Refuse to resume a study with another request schedule: every launch of a study sends
    the same requests (tuner.measure.request_schedule)."""
    if was is None or asked is None or was == asked:
        return

    def levels(plan: RequestSchedule) -> str:
        return ", ".join(f"c={lv.concurrency} {len(lv.warmups)}+{len(lv.measured)}"
                         for lv in plan.levels) + (" with repeats" if plan.allow_repeats else "")

    raise ConfigError(
        f"Study '{name}' in {out_dir} was measured on another request schedule (warm-ups + "
        f"measured requests per level: {levels(was)}; this command's: {levels(asked)}). Every "
        f"launch of a study sends the same requests: resume with the same --concurrency, "
        f"--num-prompts, --num-requests, --requests-per-slot, --num-warmups and "
        f"--allow-repeats, or pass --study-name NEW to start a new study.")


def _same_drafters(name: str, out_dir: Path, was: dict[str, str], asked: dict[str, str]
                   ) -> None:
    """Refuse to resume a study with another drafter for a method it drafts with: its trials
    at each K would then mix two drafters, and its K axis and recommendation with them."""
    changed = [(m, was[m], asked[m]) for m in sorted(was.keys() & asked.keys())
               if was[m] != asked[m]]
    if not changed:
        return
    method, old, new = changed[0]
    raise ConfigError(
        f"Study '{name}' in {out_dir} was started with the drafter {old} (method {method}); "
        f"this command asks for {new} (--draft-model, or the space's `model`). A study "
        f"measures one drafter per method: resume it with --draft-model {old} (or without "
        f"--draft-model, where that is the space's own drafter), or pass a new --output-dir "
        f"(or --study-name NEW) to start a study of {new}. Nothing measured was changed.")


def schedule_of(study: Any) -> RequestSchedule | None:
    """The request schedule stored with `study`; None for a study stored before schedules."""
    return settings_of(study).schedule


def stored(trial: Any) -> StoredTrial:
    """A trial of the study (a FrozenTrial, or a live Trial, which is RUNNING) as the search
    reads it, its attrs parsed once."""
    attrs = trial.user_attrs
    state = getattr(trial, "state", None)
    config, override = attrs.get(TrialAttr.CONFIG), attrs.get(TrialAttr.CONFIG_OVERRIDE)
    result, failure = attrs.get(TrialAttr.RESULT), attrs.get(TrialAttr.FAILURE)
    return StoredTrial(
        number=trial.number, state="RUNNING" if state is None else state.name,
        role=attrs.get(TrialAttr.ROLE), label=attrs.get(TrialAttr.LABEL),
        config_key=attrs.get(TrialAttr.CONFIG_KEY),
        config=TrialConfig.model_validate(config) if config else None,
        override=TrialConfig.model_validate(override) if override else None,
        result=None if result is None else BenchResult.model_validate(result),
        failure_kind=failure.get("kind") if isinstance(failure, dict) else None,
        duplicate_of=attrs.get(TrialAttr.DUPLICATE_OF), repeat_of=attrs.get(TrialAttr.REPEAT_OF),
        wall_s=attrs.get(TrialAttr.WALL_S))


# A policy campaign run's attrs (tuner.search.ladder), by name: TrialAttr values, LadderRun's
# fields.
LADDER_RUN_ATTRS = (TrialAttr.PHASE, TrialAttr.ROLE, TrialAttr.LABEL, TrialAttr.CONFIG_KEY,
                    TrialAttr.REPEAT, TrialAttr.CONFIG, TrialAttr.RESULT, TrialAttr.FAILURE,
                    TrialAttr.TOKENS)


def ladder_run(trial: Any) -> LadderRun:
    """A policy campaign's run (a trial of the companion study) as stored."""
    return LadderRun.model_validate({k: trial.user_attrs.get(k) for k in LADDER_RUN_ATTRS})


def ladder_run_key(trial: Any) -> tuple[Any, Any, Any]:
    """What makes a campaign run the same run on resume, as its attrs store it: (phase,
    config key, repeat index)."""
    attrs = trial.user_attrs
    return (attrs.get(TrialAttr.PHASE), attrs.get(TrialAttr.CONFIG_KEY),
            attrs.get(TrialAttr.REPEAT))


def result_json(trial: Any) -> dict | None:
    """A trial's result as stored (JSON), for the lines that print it (tuner.outputs)."""
    return trial.user_attrs.get(TrialAttr.RESULT)


def failure_of(trial: Any) -> Failure | None:
    """The FAILURE attr of a trial (None: it has none), read as stored: a field it lacks
    takes Failure's default."""
    stored = trial.user_attrs.get(TrialAttr.FAILURE)
    if not isinstance(stored, dict):
        return None
    return Failure(reason=str(stored.get("reason", "")), kind=str(stored.get("kind", "failed")),
                   log_tail=str(stored.get("log_tail", "")))


# What a FAIL trial stored without a FAILURE attr is read as (Failure's defaults).
UNSTATED = Failure(reason="")


def completed(study: Any) -> dict[str, FrozenTrial]:
    """Completed, non-repeat trials by config key: duplicates are answered from these."""
    from optuna.trial import TrialState

    out = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = t.user_attrs.get(TrialAttr.CONFIG_KEY)
        if key and t.user_attrs.get(TrialAttr.ROLE) != Role.REPEAT and key not in out:
            out[key] = t
    return out


# Failure kinds that relaunching the same config on the same engine would only repeat.
# engine_crashed: vLLM exited before /health answered, which is how it refuses a config (its
# pydantic ValueError at start-up). The others depend on the moment, not on the config, and
# are relaunched when proposed again: engine_start_timeout (a slow or busy machine),
# engine_died and measurement_failed (killed mid-run, the OOM killer, load), worker_died and
# driver_died (Ray, our own driver), "failed" (an objective undefined on this run's outputs).
REJECTED_KINDS = frozenset({"engine_crashed"})
# A crash at start is transient all the same when vLLM was killed (negative status) or its log
# says something outside the config held a resource: an orphaned engine's GPU memory, a port.
_TRANSIENT_AT_START = ("out of memory", "address already in use", "busy or unavailable",
                       "no cuda gpus are available")
# Whatever its log says, a config that crashed at start this often is not launched again.
MAX_START_CRASHES = 2
ENGINE_ATTR = "engine_digest"  # trial user attr: the engine setup the trial was launched on


def engine_digest(engine: EngineSpec) -> str:
    """The engine setup that decides whether vLLM accepts a config: executable, model, flags,
    environment, device. Timeouts and host are left out: they change nothing at start-up."""
    import hashlib

    ident = [list(engine.vllm_cmd), engine.model, list(engine.extra_args),
             sorted(engine.env.items()), engine.device]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def rejected(study: Any, *, engine: str) -> dict[str, FrozenTrial]:
    """Configs that `engine` (an engine_digest) refused at start, by config key: the trial to
    answer a new proposal of one from. A crash counts only once the same engine has measured
    some config of this study (before that, the setup is as likely at fault as the config: a
    missing package, a bad flag, and a rerun after fixing it must launch again), and only
    when it does not look transient (MAX_START_CRASHES crashes count whatever they say)."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False,
                                          states=(TrialState.COMPLETE, TrialState.FAIL))
              if TrialAttr.DUPLICATE_OF not in t.user_attrs and t.user_attrs.get(ENGINE_ATTR) == engine]
    if not any(t.state == TrialState.COMPLETE for t in trials):
        return {}
    crashes: dict[str, list[tuple[FrozenTrial, Failure]]] = {}
    for t in trials:
        failure = failure_of(t)
        if t.state == TrialState.FAIL and t.user_attrs.get(TrialAttr.CONFIG_KEY) and \
                failure is not None and failure.kind in REJECTED_KINDS:
            crashes.setdefault(t.user_attrs[TrialAttr.CONFIG_KEY], []).append((t, failure))
    out = {}
    for key, crashed in crashes.items():
        ts = [t for t, _ in crashed]
        firm = [t for t, failure in crashed if not _transient(failure)]
        if firm or len(ts) >= MAX_START_CRASHES:
            out[key] = (firm or ts)[0]
    return out


def _transient(failure: Failure) -> bool:
    text = f"{failure.reason}\n{failure.log_tail}".lower()
    status = re.search(r"exited with status (-?\d+)", text)
    return bool(status and int(status[1]) < 0) or any(s in text for s in _TRANSIENT_AT_START)


def is_baseline(trial: Any) -> bool:
    """The plain no-speculation baseline (not the aligned one), by its stored config, or by its
    "method" param (or enqueued value) in studies stored while "none" was a sampled choice."""
    attrs = trial.user_attrs
    if attrs.get(TrialAttr.ROLE) == Role.ALIGNED_BASELINE:
        return False
    config = attrs.get(TrialAttr.CONFIG) or attrs.get(TrialAttr.CONFIG_OVERRIDE)
    if isinstance(config, dict):
        return not config.get("speculative_config")
    fixed = (getattr(trial, "system_attrs", None) or {}).get("fixed_params") or {}
    return (trial.params.get("method") or fixed.get("method")) == "none"


def method_choices(study: Any) -> tuple[Any, ...] | None:
    """The stored choices of the "method" param when they include the baseline (studies made
    before it left the sampled space): Optuna refuses another set of choices for the same
    categorical within one study, so such a study keeps sampling these. None otherwise."""
    for t in study.get_trials(deepcopy=False):
        dist = t.distributions.get("method")
        if dist is not None and hasattr(dist, "choices"):
            return tuple(dist.choices) if "none" in dist.choices else None
    return None


def failure_summary(study: Any, out_dir: Path) -> NoAnswer | None:
    """What keeps the study from an answer (no completed trial, or no completed baseline):
    the most common failure with its count, one reason and its log (tuner.outputs words it).
    None when the study can be analysed. Proposals answered from storage are not counted:
    nothing ran."""
    from collections import Counter

    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False) if TrialAttr.DUPLICATE_OF not in t.user_attrs]
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    if any(is_baseline(t) for t in done):
        return None
    failed = [t for t in trials if t.state == TrialState.FAIL]
    base_failed = [t for t in failed if is_baseline(t)]
    pool = failed if not done else base_failed
    found = NoAnswer(study_name=study.study_name, completed=len(done), failed=len(failed))
    if not pool:
        return found
    failures = [(t, failure_of(t) or UNSTATED) for t in pool]
    kinds = Counter(failure.kind for _, failure in failures)
    kind, count = kinds.most_common(1)[0]
    last, failure = [(t, f) for t, f in failures if f.kind == kind][-1]
    return found.model_copy(update={
        "kind": kind, "count": count, "reason": failure.reason,
        "log": str(out_dir / "trials" / str(last.number) / "engine.log")})


def counted_trials(study: Any, *, repeats: bool = False) -> int:
    """Trials that count toward --n-trials: finished ones, minus retried trials and configs
    answered from storage; repeat trials only with `repeats` (the replay strategy's
    --n-trials counts every engine launch, repeats included)."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if TrialAttr.DUPLICATE_OF in t.user_attrs:
            continue  # a config answered from storage costs no engine launch
        if not repeats and t.user_attrs.get(TrialAttr.ROLE) == Role.REPEAT:
            continue  # the Optuna search's --n-trials leaves --repeats out
        failure = failure_of(t)
        if failure is not None and failure.kind == "driver_died":
            continue
        n += 1
    return n


# What np.load and TokenCapture.from_bytes raise on bytes that are not a whole capture. A
# flipped bit in a zip header can name another compression method or encryption, so zipfile
# raises RuntimeError (NotImplementedError among them) or lzma's OSError too (found by fuzzing).
_CORRUPT = (ValueError, KeyError, EOFError, OSError, RuntimeError, zipfile.BadZipFile,
            zlib.error)


def store_tokens(study_dir: Path, trial: Any, data: bytes, *, trial_dir: Path) -> bool:
    """Keep a trial's token capture (tuner.tokens bytes, as an outcome brought them) at
    `trial_dir`/tokens.npz and point its TOKENS attr there. False, storing nothing, when the
    bytes are no capture. An identical file is left alone: an inline trial wrote it there."""
    try:
        capture = tokens.TokenCapture.from_bytes(data)
    except _CORRUPT:
        return False
    path = trial_dir / tokens.FILE_NAME
    if not (path.is_file() and path.read_bytes() == data):
        trial_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: a reader never sees half a capture
    trial.set_user_attr(TrialAttr.TOKENS, {
        "file": path.relative_to(study_dir).as_posix(),
        "requests": sum(1 for r in capture.requests if not r.warmup),
        "output_tokens": capture.output_tokens()})
    return True


def token_capture(study_dir: Path, trial: Any, *, sample: bool = False
                  ) -> tokens.TokenCapture | None:
    """The trial's token capture (its levels' requests; with `sample`, the workload sample's
    too: tuner.tokens.SAMPLE_LEVEL), or None when it has none or its file is missing or
    corrupt."""
    meta = trial.user_attrs.get(TrialAttr.TOKENS)
    if not isinstance(meta, dict) or not isinstance(meta.get("file"), str):
        return None
    try:
        capture = tokens.TokenCapture.load(study_dir / meta["file"])
    except _CORRUPT:  # OSError included: a file gone or unreadable
        return None
    return capture if sample else capture.without_sample()
