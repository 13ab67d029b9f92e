"""The orchestrator: bench(), optimize(), report(), policy() read as the pipeline.

workload -> search space -> trial config -> engine -> load -> metrics -> storage -> analysis
-> outputs. Every other module is one stage; only this one calls them in order.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from pathlib import Path

from tuner import settings as checks
from tuner import workloads
from tuner.errors import ConfigError
from tuner.records import BenchResult, EngineSpec, MeasureSettings, TrialConfig, WorkloadSpec

CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
# Measured (benchmarks/startup_mode.py): eager start-up is far shorter on 2 cores, and the
# compiled graph buys little for a 135M model on the CPU.
CPU_DEFAULT_ARGS = ("--enforce-eager", "--max-model-len", "4096")


def resolve_engine(
    *, model: str | None, vllm_cmd: str | None = None, extra_args: str | None = None,
    tokenizer: str | None = None, env: dict[str, str] | None = None,
    ready_timeout_s: float = 900.0, request_timeout_s: float = 300.0,
    level_timeout_s: float = 3600.0,
) -> EngineSpec:
    """The engine to launch: the user's model, or the embedded default on this machine."""
    from tuner import model as embedded

    gpu = embedded.has_nvidia_gpu()
    default_args: tuple[str, ...] = ()
    if model is None:
        model_path = str(embedded.embedded_model_dir())
        if not gpu:
            default_args = CPU_DEFAULT_ARGS
    else:
        model_path = model
        looks_local = model.startswith((".", "/", "~")) or os.path.exists(model)
        if looks_local and not Path(model).expanduser().exists():
            raise ConfigError(f"Model path '{model}' does not exist. Pass the folder of a Hugging "
                              f"Face checkpoint, a hub id (online machines), or omit --model for "
                              f"the embedded SmolLM2-135M-Instruct.")
        if looks_local:
            model_path = str(Path(model).expanduser().resolve())
    try:
        cmd = tuple(shlex.split(vllm_cmd)) if vllm_cmd else ()
        extra = tuple(shlex.split(extra_args)) if extra_args else ()
    except ValueError as e:
        raise ConfigError(f"Cannot split --vllm-cmd/--engine-args ({e}); check the quotes.") from None
    full_env = {} if gpu else dict(CPU_ENV)
    full_env.update(env or {})
    return EngineSpec(
        model=model_path, vllm_cmd=cmd, extra_args=default_args + extra, env=full_env,
        device="cuda" if gpu else "cpu", tokenizer=tokenizer, ready_timeout_s=ready_timeout_s,
        request_timeout_s=request_timeout_s, level_timeout_s=level_timeout_s)


def tokenizer_of(engine: EngineSpec) -> str:
    return engine.tokenizer or engine.model


def bench(
    *, workload: WorkloadSpec, engine: EngineSpec, config: TrialConfig,
    settings: MeasureSettings, out_dir: Path, show_bar: bool = False,
    say=print,
) -> BenchResult:
    """Measure one speculative config at every requested concurrency in one engine launch."""
    from tuner import runner

    wl = workloads.load(workload, tokenizer=tokenizer_of(engine),
                        pool=settings.pool_size(workload.num_prompts),
                        max_model_len=checks.max_model_len(engine.extra_args), say=say)
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"Benchmarking {config.label()} on {Path(engine.model).name}, workload {workload.name} "
        f"({len(wl.prompts)} prompts), concurrency {','.join(map(str, settings.concurrencies))}")
    t0 = time.monotonic()
    result = runner.measure(engine, config, wl, settings, trial_dir=out_dir,
                            progress=lambda m: say("  " + m), show_bar=show_bar)
    runner.write_result(result, out_dir / "result.json", workload=workload.model_dump(),
                        workload_digest=wl.digest, settings=settings.model_dump(),
                        engine_spec=engine.model_dump(), wall_s=round(time.monotonic() - t0, 1))
    return result


def check_methods(space, engine: EngineSpec) -> None:
    """Refuse up front the methods whose package or model is missing on this machine."""
    import importlib.util

    for method, params in space.methods.items():
        if method == "suffix" and not engine.vllm_cmd and \
                importlib.util.find_spec("arctic_inference") is None:
            raise ConfigError(
                f"Search space '{space.name}' includes method 'suffix', which needs the "
                f"arctic-inference package in vLLM's environment. Install it with "
                f"`pip install --no-deps arctic-inference` (scripts/setup.sh does), or use "
                f"--space ngram.")
        draft = params.get("model")
        if isinstance(draft, str) and draft.startswith(("/", ".", "~")) and \
                not Path(draft).expanduser().exists():
            raise ConfigError(
                f"Search space '{space.name}': methods.{method}.model '{draft}' does not exist. "
                f"Point it at the draft/head checkpoint folder (copy search_spaces/draft.yaml "
                f"and edit `model`).")
        if method == "mtp" and engine.device == "cpu":
            raise ConfigError(f"Search space '{space.name}': method 'mtp' needs a target model "
                              f"with MTP layers on the GPU build; drop it for the CPU engine.")


def fingerprint(engine: EngineSpec, workload: WorkloadSpec, digest: str) -> dict:
    """Versions and hardware that the results depend on (shown in every report)."""
    import importlib.metadata as md
    import platform

    import tuner

    def version(*names: str) -> str | None:
        for n in names:
            try:
                return md.version(n)
            except md.PackageNotFoundError:
                continue
        return None

    device = f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                device = f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
                break
    except OSError:
        pass
    if engine.device == "cuda":
        import subprocess

        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            device = "GPU: " + ", ".join(sorted(set(out.splitlines()))) if out else "GPU"
        except (OSError, subprocess.TimeoutExpired):
            device = "GPU"
    return {"tuner": tuner.__version__, "vllm": version("vllm", "vllm-cpu"),
            "torch": version("torch"), "device": device, "model": engine.model,
            "workload": workload.name, "workload_digest": digest,
            "temperature": workload.temperature, "ignore_eos": workload.ignore_eos}


def _one_driver(fn):
    """The decorated call is a driver: a study it opens for writing stays locked until the call
    returns (tuner.storage), so two drivers never write one study."""
    import functools

    @functools.wraps(fn)
    def as_driver(**kwargs):
        from tuner import storage

        with storage.driver(say=kwargs.get("say", print)):
            return fn(**kwargs)

    return as_driver


@_one_driver
def repair(*, study_dir: Path, say=print) -> str:
    """Quarantine the bad lines of a study's journal, keep every good record, check it loads."""
    from tuner import storage

    return storage.repair(study_dir)


@_one_driver
def optimize(
    *, workload: WorkloadSpec, engine: EngineSpec, space_name: str, settings: MeasureSettings,
    out_dir: Path, study_name: str, n_trials: int, timeout_s: float | None = None,
    sampler: str = "tpe", seed: int | None = 0, objectives: list[str],
    target_concurrency: int, constraints: dict, storage_url: str | None = None,
    ray_address: str | None = None, parallel: int | None = None, repeats: int = 1,
    gpus_per_trial: float | None = None, logical_gpus: int | None = None,
    acceptance_rates: list[float] | None = None, aligned_baseline: TrialConfig | None = None,
    say=print,
):
    """Search the space with Optuna; every trial is one engine launch measured at all levels."""
    from tuner import space as spaces
    from tuner import study as st

    sp = spaces.load(space_name)
    st.validate_objectives(objectives)
    if sampler not in st.SAMPLERS:
        raise ConfigError(f"Unknown sampler '{sampler}'. Available: {', '.join(st.SAMPLERS)}.")
    if target_concurrency not in settings.concurrencies:
        raise ConfigError(f"--target-concurrency {target_concurrency} is not among --concurrency "
                          f"{','.join(map(str, settings.concurrencies))}; add it there.")
    check_methods(sp, engine)
    wl = workloads.load(workload, tokenizer=tokenizer_of(engine),
                        pool=settings.pool_size(workload.num_prompts),
                        max_model_len=checks.max_model_len(engine.extra_args), say=say)
    attrs = {"workload": workload.model_dump(), "workload_digest": wl.digest,
             "engine_spec": engine.model_dump(), "settings": settings.model_dump(),
             "space": sp.name, "objectives": objectives,
             "target_concurrency": target_concurrency, "constraints": constraints,
             "acceptance_profile": acceptance_rates,
             "fingerprint": fingerprint(engine, workload, wl.digest)}
    constrained = any(v is not None for v in constraints.values())
    study = st.create(out_dir=out_dir, name=study_name, objectives=objectives,
                      sampler=st.make_sampler(sampler, seed=seed, constrained=constrained),
                      storage_url=storage_url, settings=attrs)
    retry = st.recover_orphans(study)
    if retry:
        say(f"Resuming: {len(retry)} trial(s) interrupted by a dead driver will be retried.")
    _enqueue_start(study, sp, sampler, retry)
    if aligned_baseline is not None and not any(
            t.user_attrs.get("role") == "aligned_baseline" for t in study.get_trials(deepcopy=False)
            if t.state.is_finished() or t.state.name == "WAITING"):
        # The same engine path as the speculative trials (e.g. no async scheduling, V1 runner),
        # so speculation's own effect can be told from the engine-path change it forces.
        study.enqueue_trial({"method": "none"}, user_attrs={
            "role": "aligned_baseline", "config_override": json.loads(
                aligned_baseline.model_dump_json())})
    executor = _executor(engine, ray_address=ray_address, parallel=parallel,
                         logical_gpus=logical_gpus)
    gpus = gpus_per_trial if gpus_per_trial is not None else (
        float(engine_tp(engine)) if engine.device == "cuda" or logical_gpus else 0.0)
    done_before = st.counted_trials(study)
    if done_before:
        say(f"Resuming study '{study_name}': {done_before} of {n_trials} trials already done.")
    loop = _SearchLoop(study=study, space=sp, engine=engine, workload=wl, settings=settings,
                       out_dir=out_dir, objectives=objectives, target=target_concurrency,
                       constraints=constraints, executor=executor, gpus=gpus, say=say,
                       rates=acceptance_rates)
    try:
        loop.run(n_trials=n_trials, timeout_s=timeout_s)
        if repeats > 1:
            loop.repeat_leaders(repeats=repeats)
    finally:
        executor.shutdown()
    return study


def engine_tp(engine: EngineSpec) -> int:
    args = list(engine.extra_args)
    for flag in ("--tensor-parallel-size", "-tp"):
        if flag in args and args.index(flag) + 1 < len(args):
            return int(args[args.index(flag) + 1])
    return 1


def _executor(engine: EngineSpec, *, ray_address, parallel, logical_gpus):
    from tuner import runner

    want_ray = ray_address or logical_gpus or (parallel or 1) > 1
    if want_ray or engine.device == "cuda":
        try:
            import ray  # noqa: F401
        except ImportError:
            if want_ray:
                raise ConfigError("Ray is not installed, and --ray-address/--parallel need it. "
                                  "`pip install ray` (or the offline bundle's ray wheel)."
                                  ) from None
            # One GPU and no Ray: trials run one at a time in the driver, as on a CPU.
            return runner.InlineExecutor()
        return runner.RayExecutor(address=ray_address, parallel=parallel, num_gpus=logical_gpus)
    return runner.InlineExecutor()


def _enqueue_start(study, sp, sampler: str, retry: list[dict]) -> None:
    from optuna.trial import TrialState

    from tuner import study as st

    trials = study.get_trials(deepcopy=False)
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    has_baseline = any(t.state in (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
                       and st.is_baseline(t) for t in trials)
    if not has_baseline:
        # An override, not a sampled value: "none" is no choice of the sampled method, so the
        # sampler is never steered back to this measured point (tuner.space suggest).
        study.enqueue_trial({}, user_attrs={"role": "baseline", "config_override": json.loads(
            sp.baseline().model_dump_json())})
    for params in retry:
        if params.get("method") != "none":  # a baseline is enqueued above when it is missing
            study.enqueue_trial(params, user_attrs={"role": "retry"})
    if trials and waiting:
        return
    if not trials:
        for point in sp.start_points:
            params = sp.params_of(point)
            if params:
                study.enqueue_trial(params, user_attrs={"role": "start_point"})
        if sampler == "grid":
            for params in sp.grid():
                study.enqueue_trial(params, user_attrs={"role": "search"})


class _SearchLoop:
    """Ask/tell in the driver; trials run on the executor (inline or Ray).

    What storage already knows is never launched again: a config measured before is answered
    with its result, a config the same engine refused at start with its failure (study.py
    `rejected`); neither counts toward --n-trials.
    """

    def __init__(self, *, study, space, engine, workload, settings, out_dir, objectives, target,
                 constraints, executor, gpus, say, rates=None) -> None:
        self.__dict__.update(locals())
        del self.__dict__["self"]
        from tuner import study as st

        self.launched = 0
        self.engine_digest = st.engine_digest(engine)
        self.method_choices = st.method_choices(study)
        self._space_keys: frozenset | None = None  # config keys of a finite space

    def suggest(self, trial) -> TrialConfig:
        from tuner.space import with_acceptance_profile

        return with_acceptance_profile(
            self.space.suggest(trial, method_choices=self.method_choices), self.rates)

    def config_of(self, trial) -> TrialConfig:
        """The enqueued override (baseline, aligned baseline, repeat) or the sampler's pick."""
        override = trial.user_attrs.get("config_override")
        return TrialConfig.model_validate(override) if override else self.suggest(trial)

    def _baseline(self):
        from tuner import study as st

        for t in st.completed(self.study).values():
            if st.is_baseline(t):
                return t.user_attrs.get("result")
        return None

    def run(self, *, n_trials: int, timeout_s: float | None) -> None:
        from optuna.trial import TrialState

        from tuner import study as st

        t0 = time.monotonic()
        in_flight: dict[int, tuple] = {}
        duplicates_in_row = 0
        while True:
            budget = n_trials - st.counted_trials(self.study) - len(in_flight)
            timed_out = timeout_s is not None and time.monotonic() - t0 > timeout_s
            while budget > 0 and not timed_out and len(in_flight) < self.executor.parallel:
                if not self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) \
                        and self._exhausted():
                    self.say(f"Every config of search space '{self.space.name}' "
                             f"({len(self._space_keys or ())}) is measured or refused; "
                             f"stopping the search.")
                    break
                trial = self.study.ask()
                config = self.config_of(trial)
                role = trial.user_attrs.get("role") or "search"
                if config.method == "none" and role != "aligned_baseline":
                    role = "baseline"
                st.label_trial(trial, config, "search" if role == "retry" else role)
                if self._answer_known(trial, config):
                    duplicates_in_row += 1
                    if duplicates_in_row > 25:
                        self.say("The sampler keeps proposing configs already measured or "
                                 "refused: the space looks exhausted; stopping the search.")
                        budget = 0
                    continue
                duplicates_in_row = 0
                self._submit(trial, config)
                in_flight[trial.number] = (trial, config, time.monotonic())
                self.launched += 1
                budget -= 1
                if self.executor.parallel == 1:
                    break
            if not in_flight:
                if timed_out:
                    self.say(f"--timeout {timeout_s:.0f} s reached; stopping the search.")
                return
            number, outcome = self.executor.wait_one()
            trial, config, started = in_flight.pop(number)
            self._tell(trial, config, outcome, time.monotonic() - started)

    def _exhausted(self) -> bool:
        """A finite space whose every config is measured or refused: the sampler could only
        propose known points, each one more trial answered from storage."""
        from tuner import study as st
        from tuner.space import with_acceptance_profile

        if self._space_keys is None:
            try:
                self._space_keys = frozenset(
                    with_acceptance_profile(self.space.config_from_params(p), self.rates).key()
                    for p in self.space.grid(limit=10_000))
            except ConfigError:  # continuous or too large to list: never exhausted
                self._space_keys = frozenset({None})
        known = set(st.completed(self.study)) | set(
            st.rejected(self.study, engine=self.engine_digest))
        return self._space_keys <= known

    def _submit(self, trial, config: TrialConfig) -> None:
        from tuner import study as st

        trial.set_user_attr(st.ENGINE_ATTR, self.engine_digest)
        self.executor.submit(trial.number, self.engine, config, self.workload, self.settings,
                             str(self.out_dir / "trials" / str(trial.number)),
                             num_gpus=self.gpus)

    def _answer_known(self, trial, config: TrialConfig) -> bool:
        """Tell `trial` from storage when its config was measured or refused; True if told."""
        from tuner import study as st

        dup = st.completed(self.study).get(config.key())
        if dup is not None:
            self._answer_duplicate(trial, dup)
            return True
        refused = st.rejected(self.study, engine=self.engine_digest).get(config.key())
        if refused is None:
            return False
        st.tell_known_failure(self.study, trial, refused)
        kind = refused.user_attrs["failure"].get("kind")
        self.say(f"trial {trial.number} {config.label()}: the engine refused this config in "
                 f"trial {refused.number} ({kind}); answered from storage as FAIL (no engine "
                 f"launched; a new --study-name would launch it again)")
        return True

    def _tell(self, trial, config, outcome: dict, wall_s: float) -> None:
        from tuner import study as st
        from tuner.errors import TrialFailed

        trial.set_user_attr("wall_s", round(wall_s, 1))
        for key in ("cuda_visible_devices", "host", "ran_from", "ran_to"):
            if outcome.get(key) is not None:
                trial.set_user_attr(key, outcome[key])
        total = st.counted_trials(self.study) + 1
        if "failure" in outcome:
            f = outcome["failure"]
            exc = TrialFailed(f["reason"], log_tail=f.get("log_tail", ""))
            exc.kind = f.get("kind", "failed")
            st.tell_failure(self.study, trial, exc)
            self.say(f"[{total}] trial {trial.number} {config.label()}: FAIL ({exc.kind}) "
                     f"{f['reason'][:300]} -- recorded; the study continues. Log: "
                     f"{self.out_dir / 'trials' / str(trial.number) / 'engine.log'}")
            return
        result = BenchResult.model_validate(outcome["result"])
        st.tell_result(self.study, trial, result, objectives=self.objectives,
                       concurrency=self.target, constraints=self.constraints)
        self.say(f"[{total}] trial {trial.number} " + trial_line(result, self._baseline()))

    def _answer_duplicate(self, trial, dup) -> None:
        from tuner import study as st

        result = BenchResult.model_validate(dup.user_attrs["result"])
        st.tell_result(self.study, trial, result, objectives=self.objectives,
                       concurrency=self.target, constraints=self.constraints,
                       duplicate_of=dup.number)
        self.say(f"trial {trial.number} {result.config.label()}: same config as trial "
                 f"{dup.number}, answered from storage (no engine launched)")

    def repeat_leaders(self, *, repeats: int, leaders: int = 3) -> None:
        """Re-measure the baseline and the leading configs so ranking can use their spread."""
        from optuna.trial import TrialState

        from tuner import study as st

        trials = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                  if t.user_attrs.get("duplicate_of") is None and t.user_attrs.get("config")]
        originals = [t for t in trials if t.user_attrs.get("role") != "repeat"]
        spec = sorted((t for t in originals if t.user_attrs["config"].get("speculative_config")),
                      key=lambda t: -_level_of(t, self.target, "output_throughput"))[:leaders]
        base = [t for t in originals if st.is_baseline(t)][:1]
        for t in base + spec:
            have = sum(1 for r in trials if r.user_attrs.get("repeat_of") == t.number)
            for _ in range(repeats - 1 - have):
                # The stored config itself, on a trial of its own: study.ask() would hand out a
                # WAITING grid point instead, and a re-sampled config might not be this one.
                trial = st.ask_fresh(self.study, user_attrs={
                    "role": "repeat", "repeat_of": t.number,
                    "config_override": t.user_attrs["config"]})
                config = self.config_of(trial)
                st.label_trial(trial, config, "repeat")
                self.say(f"repeat of trial {t.number} ({config.label()})")
                started = time.monotonic()
                self._submit(trial, config)
                _, outcome = self.executor.wait_one()
                self._tell(trial, config, outcome, time.monotonic() - started)


def _level_of(trial, c: int, metric: str) -> float:
    for lv in trial.user_attrs.get("result", {}).get("levels", []):
        if lv["concurrency"] == c:
            return float(lv[metric])
    return float("nan")


def trial_line(result: BenchResult, baseline: dict | None) -> str:
    """One line per finished trial: config, start-up, and per level throughput (speedup),
    TPOT and acceptance length."""
    base = {lv["concurrency"]: lv for lv in (baseline or {}).get("levels", [])}
    parts = [f"{result.config.label()}: start {result.engine.start_s:.0f} s"]
    for lv in result.levels:
        b = base.get(lv.concurrency)
        speed = (f" ({lv.output_throughput / b['output_throughput']:.2f}x)"
                 if b and b["output_throughput"] > 0 and result.config.method != "none" else "")
        acc = (f" acc {lv.spec_decode_acceptance_length:.2f}"
               if lv.spec_decode_acceptance_length is not None else "")
        parts.append(f"c={lv.concurrency} {lv.output_throughput:.1f} tok/s{speed} "
                     f"TPOT {lv.mean_tpot_ms:.1f} ms{acc}")
    return " | ".join(parts)


@_one_driver
def policy(
    *, study_dir: Path, storage_url: str | None = None, study_name: str | None = None,
    ladder: tuple[int, ...] | None = None, max_concurrency: int | None = None,
    repeats: int = 2, leaders: int = 2, k_values: tuple[int, ...] | None = None,
    num_prompts: int | None = None, output_len: int | None = None,
    max_batch: int | None = None, side_by_side: bool = False, requests_per_slot: int = 4,
    say=print,
) -> dict:
    """Measure the study's leading configs on a concurrency ladder, find where speculation
    stops paying, emit vLLM's per-batch-size schedule and verify it on the same ladder."""
    from tuner import analysis, campaign, plots, runner
    from tuner import policy as rules
    from tuner import study as st
    from tuner.errors import ConfigError as _CE

    study = st.open_existing(study_dir, storage_url, study_name, setup=True, write=True)
    meta = study.user_attrs.get(st.ATTR) or {}
    engine = EngineSpec.model_validate(meta["engine_spec"])
    wspec = WorkloadSpec.model_validate(meta["workload"])
    updates = {k: v for k, v in (("num_prompts", num_prompts), ("output_len", output_len)) if v}
    wspec = wspec.model_copy(update=updates)
    if ladder is None:
        top = max_concurrency or 16
        ladder = tuple(2 ** i for i in range(0, int(math.log2(top)) + 1))
        if ladder[-1] != top:
            ladder += (top,)
    ladder_settings = MeasureSettings(concurrencies=tuple(ladder),
                                      requests_per_slot=requests_per_slot)
    wl = workloads.load(wspec, tokenizer=tokenizer_of(engine),
                        pool=ladder_settings.pool_size(wspec.num_prompts),
                        max_model_len=checks.max_model_len(engine.extra_args), say=say)
    picks = _leaders(analysis.trials_frame(study), leaders)
    if not picks:
        raise _CE(f"Study '{study.study_name}' has no completed speculative trial yet; run "
                  f"`tuner optimize` first (the policy starts from its leading configs).")
    chosen = picks[0]
    k_best = int(chosen.speculative_config.get("num_speculative_tokens", 1))
    ks = sorted(set(k_values or (k_best, max(1, round(k_best / 2)))), reverse=True)
    runs: list[tuple[str, TrialConfig]] = [("baseline", TrialConfig())]
    runs += [("leader", c) for c in picks]
    for k in ks:
        cfg = TrialConfig(speculative_config={**chosen.speculative_config,
                                              "num_speculative_tokens": k},
                          engine_args=chosen.engine_args)
        if cfg.key() not in {r.key() for _, r in runs}:
            runs.append(("k_variant", cfg))
    say(f"Policy for study '{study.study_name}': ladder {','.join(map(str, ladder))}, "
        f"{repeats} repeat(s), {len(runs)} configs ({', '.join(c.label() for _, c in runs)})")
    measured = campaign.measure(study=study, engine=engine, workload=wl, ladder=ladder,
                                runs=runs, repeats=repeats, phase="ladder", out_dir=study_dir,
                                requests_per_slot=requests_per_slot, say=say)
    base_key = TrialConfig().key()
    base = campaign.throughput_series(measured, base_key)
    if not base:
        raise _CE("The baseline could not be measured on the ladder (see the failures in "
                  f"{study_dir}/policy); no policy without it.")
    configs = [c for _, c in runs if c.method != "none"]
    stats = {c.key(): rules.level_stats(campaign.throughput_series(measured, c.key()), base)
             for c in configs}
    per_k = {int(c.speculative_config["num_speculative_tokens"]): stats[c.key()]
             for c in configs if c.method == chosen.method
             and c.speculative_config_without_k() == chosen.speculative_config_without_k()
             and stats[c.key()]}
    picked = rules.choose_k(per_k)
    mb = max_batch or _max_num_seqs(engine) or rules.MAX_BATCH
    schedule = rules.bands(picked, per_k, max_batch=mb)
    spec = rules.policy_config(chosen.speculative_config, schedule)
    problems = rules.validate_schedule(schedule, num_speculative_tokens=max(
        [k for *_, k in schedule] + [1]))
    doc: dict = {
        "study": study.study_name, "ladder": list(ladder), "repeats": repeats,
        "workload": wspec.name, "num_prompts": wspec.num_prompts,
        "output_len": wspec.output_len, "requests_per_slot": requests_per_slot,
        "method": chosen.method, "chosen": chosen.label(),
        "configs": [{"label": c.label(), "role": role, "speculative_config":
                     c.speculative_config, "stats": stats.get(c.key(), {}),
                     "break_even": rules.break_even(stats[c.key()]) if stats.get(c.key())
                     else None} for role, c in runs if c.method != "none"],
        "baseline": {str(c): v for c, v in base.items()},
        "k_by_level": picked, "schedule": [list(b) for b in schedule],
        "schedule_problems": problems, "speculative_config": spec,
        "serve_command": None, "verification": None, "fallback_bands": None,
    }
    if spec is None:
        doc["verdict"] = ("Speculation does not pay beyond the noise at any measured level: "
                          "leave it off.")
    else:
        policy_cfg = TrialConfig(speculative_config=spec, engine_args=chosen.engine_args)
        doc["serve_command"] = _serve(engine, policy_cfg)
        static = TrialConfig(speculative_config={**chosen.speculative_config,
                                                 "num_speculative_tokens": k_best},
                             engine_args=chosen.engine_args)
        # The policy is measured on the same ladder; baseline and static come from the ladder
        # phase unless side_by_side asks to re-measure them interleaved with the policy.
        verify_runs = [("policy", policy_cfg)]
        if side_by_side:
            verify_runs = [("baseline", TrialConfig()), ("static", static)] + verify_runs
        verify = campaign.measure(
            study=study, engine=engine, workload=wl, ladder=ladder, runs=verify_runs,
            repeats=repeats, phase="verify", out_dir=study_dir,
            requests_per_slot=requests_per_slot, say=say)
        reference = verify if side_by_side else measured + verify
        doc["verification"] = _verification(reference, policy_cfg, static, rules)
        doc["verification"]["side_by_side"] = side_by_side
        doc["verdict"] = doc["verification"]["verdict"]
        if doc["verification"].get("engine_rejected") or not doc["verification"].get("honoured",
                                                                                      True):
            doc["fallback_bands"] = rules.band_table(schedule, chosen.label())
    runner.write_json_atomic(study_dir / "policy.json", doc)
    plots.policy_plot(doc, study_dir / "plots")
    return doc


def _verification(runs: list[dict], policy_cfg: TrialConfig, static: TrialConfig, rules) -> dict:
    from tuner import campaign

    base = campaign.throughput_series(runs, TrialConfig().key())
    failures = [r["failure"] for r in runs if r["key"] == policy_cfg.key() and r.get("failure")]
    pol = campaign.throughput_series(runs, policy_cfg.key())
    if not pol:
        reason = failures[0]["reason"] if failures else "no successful run"
        return {"engine_rejected": True, "reason": reason,
                "verdict": f"The installed vLLM did not run the schedule ({reason}); use the "
                           f"band table below in a router instead."}
    st_pol = rules.level_stats(pol, base)
    st_static = rules.level_stats(campaign.throughput_series(runs, static.key()), base)
    drafts = campaign.drafts_series(runs, policy_cfg.key())
    sched = policy_cfg.speculative_config.get("num_speculative_tokens_per_batch_size") or []
    # Honoured: where the table says K=0 the engine drafts far less than the static config
    # at the same level (not zero: as a level drains, the batch shrinks into the K>0 range).
    static_drafts = campaign.drafts_series(runs, static.key())
    honoured = True
    for c, values in drafts.items():
        k = next((k for s, e, k in sched if s <= c <= e), None)
        ref = statistics_median(static_drafts.get(c, []))
        if k == 0 and values and ref and statistics_median(values) > 0.5 * ref:
            honoured = False
    rows = []
    worse = []
    for c in sorted(st_pol):
        p, s = st_pol[c], st_static.get(c)
        if rules.loses(p):
            worse.append(c)
        rows.append({"concurrency": c, "policy_speedup": p["speedup"], "policy_noise": p["noise"],
                     "static_speedup": s["speedup"] if s else None,
                     "policy_drafts": statistics_median(drafts.get(c, [])),
                     "below_baseline_beyond_noise": rules.loses(p)})
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


def statistics_median(values: list[float]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def _serve(engine: EngineSpec, config: TrialConfig) -> str:
    """The serve command with the engine arguments the policy was measured with."""
    import shlex

    from tuner.engine import serve_command

    cmd = serve_command(engine, config)
    return cmd + (" " + shlex.join(engine.extra_args) if engine.extra_args else "")


def _max_num_seqs(engine: EngineSpec) -> int | None:
    args = list(engine.extra_args)
    if "--max-num-seqs" in args and args.index("--max-num-seqs") + 1 < len(args):
        return int(args[args.index("--max-num-seqs") + 1])
    return None


def _leaders(df, n: int) -> list[TrialConfig]:
    """Best completed config per method at the lowest level (medians over repeats)."""
    from tuner import analysis

    ok = analysis.with_medians(df)
    ok = ok[(ok["state"] == "COMPLETE") & (ok["method"] != "none")]
    if ok.empty:
        return []
    low = ok[ok["concurrency"] == ok["concurrency"].min()]
    best = low.sort_values("output_throughput", ascending=False).drop_duplicates("method")
    out = []
    for _, row in best.head(n).iterrows():
        spec = json.loads(row["spec_json"]) if row["spec_json"] else None
        eng = json.loads(row["engine_args_json"]) if row.get("engine_args_json") else {}
        out.append(TrialConfig(speculative_config=spec, engine_args=eng or {}))
    return out
