"""Where run-to-run spread comes from: one config launched several times, each measured many ways.

`run`: `--launches` launches of one config (with `--interleave SPEC`, a launch of SPEC between
each two: order), each measured level by level with tuner's own bench against the running
server: (a) `--reps` times the old way (one block, --stability 0), each repeat on prompts of
its own, repeat r on the same prompts in every launch; (b) once converging (--stability);
(c) on another prompt sample (seed + 1); (d) the last repeat's prompts again at once (prefix
cache warm); (e) at the top level, 4x the requests; (f) no warm-up requests. Around each one
noise_probes.py samples (g) this process's CPU (the load generator, its client processes
included), (h) the load average and other processes' CPU, the engine's processes and the GPU.
Each measurement is one JSON file under --out, written whole or not at all; a launch is what a
later call resumes at. `analyze` prints per level the variance components, each suspect's
effect beside the within-launch spread, the spread of identical launches (old way against
converging, with the time each cost), and throughput against the engine's CPU and the GPU's
clocks (noise_covariates.py).

    .venv/bin/python benchmarks/noise_sources.py run --out DIR [--budget-s 500] [--launches 3]
        [--suspects a,b,c,d,e,f] [--interleave SPEC_JSON] [--concurrency 1,8,32]
    .venv/bin/python benchmarks/noise_sources.py analyze DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from noise_covariates import BOUND_CORES, READING_P, busiest, engine_report
from noise_probes import CpuMark, Monitor, gpu_placement

from tuner import api, checks, engine_cmdline
from tuner.api import engines
from tuner.errors import ConfigError, TrialFailed
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import BenchOptions, EngineOptions
from tuner.records.results import BenchResult

Say = Callable[[str], None]
SUSPECTS = {"a": "repeats within a launch", "b": "converging measurement",
            "c": "other prompt sample", "d": "same prompts again (prefix cache warm)",
            "e": "4x the requests", "f": "no warm-up requests",
            "g": "load generator's CPU", "h": "other processes' CPU",
            "i": "launch after another config"}
TEARDOWN_S = 30.0  # kept free at the end of the budget: an engine's SIGTERM grace and reaping
LONG = 4  # (e): requests of the long measurement, and the prompts a converging one may draw
GPU_DEFAULTS = {"concurrency": "1,8,32", "num_prompts": 16, "output_len": 128, "launch_s": 170}
CPU_DEFAULTS = {"concurrency": "1,4", "num_prompts": 4, "output_len": 64, "launch_s": 420}


class Clock:
    """The call's budget, and progress lines stamped with the time and seconds since start."""

    def __init__(self, budget_s: float) -> None:
        self.t0, self.budget_s = time.monotonic(), budget_s

    def left(self) -> float:
        return self.t0 + self.budget_s - time.monotonic()

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - self.t0:4.0f}s] {message}",
              flush=True)


# --- the plan: which measurements a launch makes, and which prompts each sends -------------
@dataclass(frozen=True)
class Step:
    """One measurement of a launch, at one level."""

    level: int
    name: str  # rep0.., nowarm, again, sample, converge, long
    suspect: str
    requests: int
    warmups: int
    converging: bool = False
    prompts_like: str | None = None  # "again": the step whose prompts it sends once more

    @property
    def key(self) -> str:
        return f"c{self.level}/{self.name}"

    @property
    def pool(self) -> int:
        """Prompts the step sends at most: warm-ups and requests; a converging step's windows
        may draw up to LONG x the level's requests."""
        return self.warmups + self.requests * (LONG if self.converging else 1)


def plan_steps(levels: Sequence[int], suspects: str, *, reps: int,
               requests_of: Callable[[int], int], warmups_of: Callable[[int], int]
               ) -> list[Step]:
    """A launch's measurements in the order they run, level by level. The repeats (a) are the
    reference of every other suspect: without (a), one repeat still runs."""
    steps: list[Step] = []
    n_reps = reps if "a" in suspects else 1
    for c in levels:
        n, w = requests_of(c), warmups_of(c)
        if "f" in suspects:
            steps.append(Step(c, "nowarm", "f", n, 0))
        steps += [Step(c, f"rep{r}", "a", n, w) for r in range(n_reps)]
        if "d" in suspects:
            steps.append(Step(c, "again", "d", n, w, prompts_like=f"rep{n_reps - 1}"))
        if "c" in suspects:
            steps.append(Step(c, "sample", "c", n, w))
        if "b" in suspects:
            steps.append(Step(c, "converge", "b", n, w, converging=True))
        if "e" in suspects and c == max(levels):
            steps.append(Step(c, "long", "e", LONG * n, w))
    return steps


@dataclass(frozen=True)
class Allocation:
    """The prompts one step sends: indices into the main or the other sample, and how many of
    them this launch sent before (the same text, earlier in the plan or earlier in the step)."""

    source: str
    indices: tuple[int, ...]
    seen_before: int = 0


def allocate(steps: Sequence[Step], main: Sequence[str], other: Sequence[str]
             ) -> dict[str, Allocation]:
    """Which prompts each step sends, the same in every launch: the main sample in order
    (wrapping round where the data holds fewer), the other sample for (c), the named step's
    prompts for (d)."""
    if not main:
        raise ValueError("allocate needs at least one prompt")
    out: dict[str, Allocation] = {}
    cursor = {"main": 0, "other": 0}
    sent: set[str] = set()
    for s in steps:
        if s.prompts_like is not None:
            ref = out[f"c{s.level}/{s.prompts_like}"]
            alloc = Allocation(ref.source, ref.indices)
        else:
            source = "other" if s.suspect == "c" and other else "main"
            pool = other if source == "other" else main
            start = cursor[source]
            cursor[source] += s.pool
            alloc = Allocation(source, tuple((start + i) % len(pool) for i in range(s.pool)))
        seen = 0
        for i in alloc.indices:
            text = (main if alloc.source == "main" else other)[i]
            seen += text in sent
            sent.add(text)
        out[s.key] = replace(alloc, seen_before=seen)
    return out


@dataclass(frozen=True)
class Launch:
    """One engine launch of the run: the config studied ("main") or, with --interleave, the
    other config placed between two of its launches ("between")."""

    index: int
    role: str
    predecessor: str  # the role of the launch before it; "none" for the first

    @property
    def folder(self) -> str:
        return f"launch-{self.index:02d}-{self.role}"


def launch_sequence(launches: int, *, interleave: bool) -> list[Launch]:
    """main, main, ... or, interleaved, main, between, main, between, main."""
    roles: list[str] = []
    for i in range(launches):
        if i and interleave:
            roles.append("between")
        roles.append("main")
    return [Launch(i + 1, role, roles[i - 1] if i else "none") for i, role in enumerate(roles)]


# --- one measurement: tuner's bench against the running engine, in this process --------------
def bench_running(url: str, engine: EngineSpec, *, workload: WorkloadSpec,
                  settings: MeasureSettings, out: Path, say: Say
                  ) -> tuple[BenchResult, dict[str, float], Path]:
    """`tuner bench --base-url URL` in this process, into `out`.part (the caller renames it
    to `out` once complete, so an interrupted call leaves no result); with this process's CPU
    from when the bench starts sending (its "Benchmarking" line) to its return. Requests carry
    $OPENAI_API_KEY, which the caller sets to the engine's key."""
    part = out.with_name(out.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    mark = CpuMark()

    def hear(message: str) -> None:
        nonlocal mark
        if message.startswith("Benchmarking"):
            mark = CpuMark()
        say(message)

    live = EngineOptions(base_url=url, model=engine.model, tokenizer=engine.tokenizer,
                         request_timeout_s=engine.request_timeout_s,
                         level_timeout_s=engine.level_timeout_s)
    try:
        result = api.bench(BenchOptions(workload=workload, engine=live, settings=settings,
                                        out_dir=part), say=hear)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)  # an interrupted measurement leaves nothing
        raise
    return result, mark.until_now(), part


def publish(part: Path, out: Path, name: str, doc: dict[str, Any]) -> None:
    """Write `doc` into `part` as `name` and rename the folder to `out`: all or nothing."""
    (part / name).write_text(json.dumps(_finite(doc), indent=1))
    shutil.rmtree(out, ignore_errors=True)
    part.rename(out)


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinite float as None: what JSON can hold."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def stability_settings(*, converging: bool, pct: float, max_s: float | None) -> dict[str, Any]:
    """MeasureSettings' fields for the old way (one block) or the converging measurement; {}
    on a tuner without --stability, where only the old way exists."""
    fields = MeasureSettings.model_fields
    if "stability_pct" not in fields:
        if converging:
            raise ConfigError("suspect b: this tuner has no --stability (MeasureSettings."
                              "stability_pct). Drop b from --suspects.")
        return {}
    out: dict[str, Any] = {"stability_pct": pct if converging else 0.0}
    if converging and max_s is not None:
        out["stability_max_s"] = max_s
    return out


# --- run: the launches, each measured step by step ------------------------------------------
@dataclass(frozen=True)
class Run:
    """What every launch of one run shares."""

    out: Path
    engine: EngineSpec
    configs: dict[str, TrialConfig]  # by launch role
    steps: dict[str, list[Step]]  # by launch role
    allocations: dict[str, Allocation]
    sampling: WorkloadSpec  # its temperature and ignore_eos go with every measurement
    stability: tuple[float, float | None]  # --stability, --stability-max-s
    clock: Clock
    detail: Say
    gpu: dict[str, Any] = field(default_factory=dict)  # gpu_placement(), read once a run


def measure_step(run: Run, launch: Launch, step: Step, url: str) -> dict[str, Any]:
    """One step against the launch's engine at `url`; its measurement.json, also returned."""
    alloc = run.allocations[step.key]
    prompts = run.out / "prompts" / f"c{step.level}-{step.prompts_like or step.name}.jsonl"
    workload = WorkloadSpec(name="custom", dataset_path=str(prompts),
                            num_prompts=len(alloc.indices), seed=0, skip_chat_template=True,
                            temperature=run.sampling.temperature,
                            ignore_eos=run.sampling.ignore_eos)
    pct, max_s = run.stability
    settings = MeasureSettings(concurrencies=(step.level,), num_requests=step.requests,
                               num_warmups=step.warmups, **stability_settings(
                                   converging=step.converging, pct=pct, max_s=max_s))
    out = run.out / launch.folder / f"c{step.level}" / step.name
    monitor = Monitor(gpu=run.gpu)
    monitor.start()
    t0 = time.monotonic()
    try:
        result, usage, part = bench_running(url, run.engine, workload=workload,
                                            settings=settings, out=out, say=run.detail)
    finally:
        monitor.halt.set()
        monitor.join()
    doc = step_doc(step, launch, alloc, result, usage=usage, monitor=monitor.summary())
    doc["wall_s"] = time.monotonic() - t0
    publish(part, out, "measurement.json", doc)
    return doc


def step_doc(step: Step, launch: Launch, alloc: Allocation, result: BenchResult, *,
             usage: dict[str, float], monitor: dict[str, Any]) -> dict[str, Any]:
    """What analyze reads of one measurement. (g) client_cores: this process's CPU and its
    client processes', less the monitor's own and its nvidia-smi calls' (their share of the
    measurement's window), per second of the measurement."""
    lv = result.levels[0]
    share = min(1.0, usage["window_s"] / monitor["elapsed_s"]) if monitor["elapsed_s"] else 1.0
    probe_s = (monitor.get("gpu") or {}).get("probe_cpu_s", 0.0)
    cpu_s = (usage["self_cpu_s"] + usage["children_cpu_s"]
             - share * (monitor["monitor_cpu_s"] + probe_s))
    return {"launch": launch.index, "role": launch.role, "predecessor": launch.predecessor,
            "level": step.level, "name": step.name, "suspect": step.suspect,
            "requests": step.requests, "warmups": step.warmups, "converging": step.converging,
            "prompts": alloc.source, "prompts_sent": len(alloc.indices),
            "prompts_seen_before": alloc.seen_before,
            "output_throughput": lv.output_throughput, "mean_tpot_ms": lv.mean_tpot_ms,
            "duration_s": lv.duration, "failed": lv.failed,
            "reused_prompts": lv.reused_prompts,
            # Windows (--stability): absent from a tuner without them.
            "windows": list(getattr(lv, "windows", ()) or ()),
            "converged": getattr(lv, "converged", None),
            "stability_pct": getattr(lv, "stability_pct", None),
            "measure_s": getattr(lv, "measure_s", None),
            **usage, "client_cores": max(0.0, cpu_s) / max(usage["window_s"], 1e-9),
            "monitor": monitor, "t_end": time.time(),
            "level_metrics": json.loads(lv.model_dump_json())}


def _kind(step: Step) -> str:
    return f"c{step.level}/{step.name.rstrip('0123456789')}"


def _step_line(doc: dict[str, Any]) -> str:
    note = ""
    if doc["converged"] is not None:
        note = (f", {len(doc['windows'])} windows, "
                f"{'converged' if doc['converged'] else 'NOT converged'}")
    core = busiest(doc)
    if core is not None and core["main_cores"] is not None:
        note += f", {core['label']} main thread {core['main_cores']:.2f} cores"
    if (sm := (doc["monitor"].get("gpu") or {}).get("sm_mhz_mean")) is not None:
        note += f", SM {sm:.0f} MHz"
    return (f"  c={doc['level']} {doc['name']:8} {doc['output_throughput']:9.1f} tok/s  TPOT "
            f"{doc['mean_tpot_ms']:6.2f} ms  {doc['window_s']:5.1f} s  client "
            f"{doc['client_cores']:.2f} cores  others {doc['monitor']['others_cores']:.2f} "
            f"cores{note}")


def run_launch(run: Run, launch: Launch, estimates: dict[str, float]) -> str:
    """One engine, every step of its role while the budget lasts; its launch.json says
    running while it runs, then complete, partial (the budget ran out) or failed."""
    from tuner.measure.engine import Engine

    folder = run.out / launch.folder
    folder.mkdir(parents=True, exist_ok=True)
    config = run.configs[launch.role]
    doc: dict[str, Any] = {"index": launch.index, "role": launch.role,
                           "predecessor": launch.predecessor, "label": config.label(),
                           "config": config.model_dump(mode="json"), "status": "running",
                           "gpu": run.gpu}
    _write_json(folder / "launch.json", doc)
    t0, status = time.monotonic(), "complete"
    run.clock.say(f"launch {launch.index} ({launch.role}: {config.label()}): engine starting")
    try:
        with Engine(run.engine, config, log_path=folder / "engine.log") as eng:
            os.environ["OPENAI_API_KEY"] = eng.api_key  # what a --base-url bench sends
            doc.update(start_s=eng.info.start_s, vllm_version=eng.info.vllm_version)
            run.clock.say(f"launch {launch.index}: engine ready in {eng.info.start_s:.0f} s")
            for step in run.steps[launch.role]:
                need = estimates.get(_kind(step), 0.0)
                if step.converging:  # its windows may run up to their time cap
                    need = max(need, run.stability[1] or 60.0)
                if run.clock.left() - TEARDOWN_S < need:
                    run.clock.say(f"launch {launch.index}: {run.clock.left():.0f} s left, "
                                  f"{step.key} takes about {need:.0f} s: ending this launch")
                    status = "partial"
                    break
                m = measure_step(run, launch, step, eng.url)
                estimates[_kind(step)] = max(need, m["wall_s"])
                run.clock.say(_step_line(m))
    except TrialFailed as e:
        status, doc["reason"] = "failed", str(e)
        run.clock.say(f"launch {launch.index} failed: {e}")
    doc.update(status=status, wall_s=time.monotonic() - t0)
    _write_json(folder / "launch.json", doc)
    run.clock.say(f"launch {launch.index}: {status} in {doc['wall_s']:.0f} s")
    return status


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(doc), indent=1))
    tmp.replace(path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def estimates_from(out: Path) -> tuple[dict[str, float], float | None]:
    """What earlier calls measured: the longest wall time of each kind of step, and the
    latest launch's (None before any launch ended; the first launch also compiled, later ones
    reuse vLLM's compile cache)."""
    steps: dict[str, float] = {}
    for path in out.glob("launch-*/c*/*/measurement.json"):
        if ".incomplete" in str(path) or (doc := _read_json(path)) is None:
            continue
        kind = f"c{doc['level']}/{doc['name'].rstrip('0123456789')}"
        steps[kind] = max(steps.get(kind, 0.0), doc["wall_s"])
    walls = [d["wall_s"] for p in sorted(out.glob("launch-*/launch.json"))
             if ".incomplete" not in str(p) and (d := _read_json(p))
             and d.get("status") in ("complete", "partial")]
    return steps, walls[-1] if walls else None


def load_samples(args: argparse.Namespace, engine: EngineSpec, steps: Sequence[Step]
                 ) -> tuple[list[Any], list[Any]]:
    """The main prompt sample (--seed) and the other one (seed + 1, for c), each as large as
    the plan draws or as the data holds."""
    from tuner.measure import workloads

    need_main = sum(s.pool for s in steps if s.suspect != "c" and s.prompts_like is None)
    need_other = sum(s.pool for s in steps if s.suspect == "c")
    limits = engine_cmdline.engine_limits(engine)

    def sample(seed: int, n: int) -> list[Any]:
        spec = WorkloadSpec(name=args.workload, dataset_path=args.dataset_path, num_prompts=n,
                            seed=seed, output_len=args.output_len)
        return list(workloads.load(spec, tokenizer=engine.tokenizer or engine.model, pool=n,
                                   max_model_len=limits.max_model_len).prompts)

    return sample(args.seed, need_main), sample(args.seed + 1, need_other) if need_other else []


def prepare(out: Path, plan: dict[str, Any], steps: Sequence[Step],
            samples: tuple[list[Any], list[Any]]) -> dict[str, Allocation]:
    """run.json and every step's prompts file, made once: a later call into the same folder
    must run the same plan (it resumes it) or is refused."""
    main, other = samples
    allocations = allocate(steps, [p.prompt for p in main], [p.prompt for p in other])
    previous = _read_json(out / "run.json")
    if previous is not None and previous.get("plan") != plan:
        changed = sorted(k for k in plan if previous.get("plan", {}).get(k) != plan[k])
        raise ConfigError(f"--out {out}: it holds a run with other settings ({', '.join(changed)}"
                          f" differ). Resume it with the same options, or pass another --out.")
    out.mkdir(parents=True, exist_ok=True)
    folder = out / "prompts"
    folder.mkdir(exist_ok=True)
    for s in steps:
        path = folder / f"c{s.level}-{s.name}.jsonl"
        if s.prompts_like is None and not path.exists():
            pool = main if allocations[s.key].source == "main" else other
            rows = [{"prompt": pool[i].prompt, "output_tokens": pool[i].output_len}
                    for i in allocations[s.key].indices]
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if previous is None:
        _write_json(out / "run.json", {
            "plan": plan, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "host": {"cores": os.cpu_count(), "node": os.uname().nodename},
            "distinct_prompts": {"main": len({p.prompt for p in main}),
                                 "other": len({p.prompt for p in other})},
            "steps": [{"key": s.key, "requests": s.requests, "warmups": s.warmups,
                       "prompts": allocations[s.key].source,
                       "seen_before": allocations[s.key].seen_before} for s in steps]})
    return allocations


def run(args: argparse.Namespace) -> None:
    clock = Clock(args.budget_s)
    engine = engines.resolve_engine(EngineOptions(model=args.model, extra_args=args.engine_args))
    settings = MeasureSettings(requests_per_slot=args.requests_per_slot)
    steps = {"main": plan_steps(args.concurrency, args.suspects, reps=args.reps,
                                requests_of=lambda c: settings.requests_for(c, args.num_prompts),
                                warmups_of=settings.warmups_for)}
    configs = {"main": TrialConfig(speculative_config=args.speculative_config)}
    if args.interleave:
        configs["between"] = TrialConfig(speculative_config=args.interleave)
        steps["between"] = [s for s in steps["main"] if s.suspect == "a"]
    if any(s.converging for s in steps["main"]):
        stability_settings(converging=True, pct=args.stability, max_s=None)  # refused early
    # A tuner whose windows drew prompts until they agreed had a time cap per level; one whose
    # windows are fixed slices of the schedule has none.
    cap = MeasureSettings.model_fields.get("stability_max_s")
    max_s = getattr(args, "stability_max_s", None) or (cap.default if cap is not None else None)
    plan = json.loads(json.dumps({
        "model": engine.model, "engine_args": list(engine.extra_args), "device": engine.device,
        "workload": args.workload, "dataset_path": args.dataset_path, "seed": args.seed,
        "num_prompts": args.num_prompts, "output_len": args.output_len,
        "requests_per_slot": args.requests_per_slot, "levels": list(args.concurrency),
        "reps": args.reps, "suspects": args.suspects, "config": args.speculative_config,
        "interleave": args.interleave,
        "temperature": args.temperature, "stability": args.stability, "stability_max_s": max_s}))
    clock.say(f"noise sources: {Path(engine.model).name} ({engine.device}), {args.workload}, "
              f"levels {','.join(map(str, args.concurrency))}, {args.launches} launches, "
              f"suspects {args.suspects}, budget {args.budget_s:.0f} s -> {args.out}")
    allocations = prepare(args.out, plan, steps["main"], load_samples(args, engine, steps["main"]))
    ctx = Run(out=args.out, engine=engine, configs=configs, steps=steps, allocations=allocations,
              sampling=WorkloadSpec(name=args.workload, temperature=args.temperature),
              stability=(args.stability, max_s), clock=clock,
              detail=clock.say if args.verbose else (lambda _m: None), gpu=gpu_placement())
    run_launches(ctx, args)
    if load_measurements(args.out):
        analyze(args.out)


def run_launches(run: Run, args: argparse.Namespace) -> None:
    """Every launch not yet done, while the budget holds one more; a launch an earlier call
    left running (killed) is set aside and measured again."""
    estimates, launch_s = estimates_from(run.out)
    for launch in launch_sequence(args.launches, interleave=bool(args.interleave)):
        folder = run.out / launch.folder
        state = _read_json(folder / "launch.json")
        if state is not None and state.get("status") != "running":
            continue
        if folder.exists():
            aside = folder.with_name(f"{folder.name}.incomplete-{int(time.time())}")
            folder.rename(aside)
            run.clock.say(f"launch {launch.index} was cut short by an earlier call: set aside "
                          f"as {aside.name}, measured again")
        need = launch_s or args.launch_s
        if run.clock.left() < need:
            run.clock.say(f"{run.clock.left():.0f} s left, a launch takes about {need:.0f} s: "
                          f"stopping here; the same command resumes at launch {launch.index}")
            return
        if run_launch(run, launch, estimates) != "failed":
            launch_s = (_read_json(folder / "launch.json") or {}).get("wall_s", launch_s)
    run.clock.say("every launch is measured")


# --- analyze: the statistics (pure), then the tables -----------------------------------------
@dataclass(frozen=True)
class Components:
    """Spread of one level's repeats (a launches x repeats table, repeat r on the same prompts
    in every launch), each as an SD in percent of the grand mean. within: the repeats of one
    launch, as a user repeating a bench sees them; split (two-way, one value per cell) into
    prompts (the prompt sets' own differences) and timing (the rest). launch: between
    launches, less what the timing noise alone puts between launch means; launch_means: the
    plain SD of the launch means. None where the table cannot say (one launch, one repeat)."""

    mean: float
    launches: int
    reps: int
    within_pct: float | None
    prompts_pct: float | None
    timing_pct: float | None
    launch_pct: float | None
    launch_means_pct: float | None


def components(table: Sequence[Sequence[float]]) -> Components:
    rows = [list(r) for r in table]
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("components needs a full launches x repeats table")
    n_l, n_r = len(rows), len(rows[0])
    grand = statistics.fmean(v for r in rows for v in r)
    if not grand > 0:
        raise ValueError(f"components needs a positive mean, got {grand}")
    row_m = [statistics.fmean(r) for r in rows]
    col_m = [statistics.fmean(r[j] for r in rows) for j in range(n_r)]
    ss_col = n_l * sum((c - grand) ** 2 for c in col_m)
    ss_res = sum((rows[i][j] - row_m[i] - col_m[j] + grand) ** 2
                 for i in range(n_l) for j in range(n_r))
    within = math.sqrt((ss_col + ss_res) / (n_l * (n_r - 1))) if n_r > 1 else None
    df_res = (n_l - 1) * (n_r - 1)
    ms_res = ss_res / df_res if df_res else None
    prompts = timing = None
    if ms_res is not None:
        timing = math.sqrt(ms_res)
        prompts = math.sqrt(max(0.0, (ss_col / (n_r - 1) - ms_res) / n_l))
    means_sd = statistics.stdev(row_m) if n_l > 1 else None
    # Repeat r sends the same prompts in every launch, so prompt sets cancel in launch means:
    # only the timing noise is corrected for (with one repeat per launch, nothing can be).
    launch = None if means_sd is None else math.sqrt(
        max(0.0, means_sd ** 2 - (ms_res or 0.0) / n_r))

    def pct(sd: float | None) -> float | None:
        return None if sd is None else 100.0 * sd / grand

    return Components(mean=grand, launches=n_l, reps=n_r, within_pct=pct(within),
                      prompts_pct=pct(prompts), timing_pct=pct(timing), launch_pct=pct(launch),
                      launch_means_pct=pct(means_sd))


def half_range_pct(values: Sequence[float]) -> float | None:
    """Half the range over the median, in percent; None for fewer than two values."""
    if len(values) < 2:
        return None
    median = statistics.median(values)
    return 100.0 * (max(values) - min(values)) / 2.0 / median if median > 0 else None


@dataclass(frozen=True)
class Effect:
    """A suspect's effect on throughput in percent, its spread (the SD over launches for a
    paired effect, the standard error for a split one; None from one value) and how many
    values it rests on."""

    pct: float
    spread: float | None
    n: int

    def exceeds(self, within_pct: float | None) -> str:
        """Whether the effect is larger than one measurement's within-launch SD."""
        if within_pct is None:
            return "?"
        return "yes" if abs(self.pct) > within_pct else "no"


def paired_effect(values: dict[int, float], refs: dict[int, float]) -> Effect | None:
    """Per launch, the suspect's figure over the launch's reference, in percent (-5: 5% less
    throughput); their mean and SD over launches."""
    diffs = [100.0 * (v / refs[k] - 1.0) for k, v in values.items()
             if k in refs and refs[k] > 0 and math.isfinite(v)]
    if not diffs:
        return None
    return Effect(pct=statistics.fmean(diffs),
                  spread=statistics.stdev(diffs) if len(diffs) > 1 else None, n=len(diffs))


def split_effect(points: Sequence[tuple[float, float]]) -> Effect | None:
    """(g), (h): (covariate, residual %) pairs, the residual a repeat's throughput against its
    launch's mean. Ordered by the covariate (CPU in use), the upper half's mean residual minus
    the lower half's, with the standard error of that difference; None under 4 points."""
    pts = sorted((x, r) for x, r in points if math.isfinite(x) and math.isfinite(r))
    if len(pts) < 4:
        return None
    half = len(pts) // 2
    low, high = [r for _, r in pts[:half]], [r for _, r in pts[-half:]]
    se = math.sqrt(statistics.variance(low) / half + statistics.variance(high) / half)
    return Effect(pct=statistics.fmean(high) - statistics.fmean(low), spread=se, n=len(pts))


def order_effect(means: dict[int, float], predecessor: dict[int, str]) -> Effect | None:
    """(i): launch means (in percent of their median) of the launches that followed the other
    config, less those of the rest; with the standard error of that difference."""
    if len(means) < 2:
        return None
    mid = statistics.median(means.values())
    rel = {k: 100.0 * (v / mid - 1.0) for k, v in means.items()}
    after = [r for k, r in rel.items() if predecessor.get(k) == "between"]
    rest = [r for k, r in rel.items() if predecessor.get(k) != "between"]
    if not after or not rest:
        return None
    var = [statistics.variance(g) / len(g) for g in (after, rest) if len(g) > 1]
    return Effect(pct=statistics.fmean(after) - statistics.fmean(rest),
                  spread=math.sqrt(sum(var)) if var else None, n=len(means))


@dataclass(frozen=True)
class LevelData:
    """One level's measurements of the main launches, by (launch, step name)."""

    level: int
    docs: dict[tuple[int, str], dict[str, Any]]
    launches: list[int]
    reps: list[str]

    @classmethod
    def of(cls, docs: Sequence[dict[str, Any]], level: int) -> LevelData:
        mine = {(d["launch"], d["name"]): d for d in docs
                if d["level"] == level and d["role"] == "main"}
        reps = sorted({n for _, n in mine if n.startswith("rep")}, key=lambda n: int(n[3:]))
        return cls(level=level, docs=mine, launches=sorted({k for k, _ in mine}), reps=reps)

    def values(self, name: str, key: str = "output_throughput") -> dict[int, float]:
        return {k: d[key] for (k, n), d in self.docs.items() if n == name and d[key] is not None}

    def table(self) -> list[list[float]]:
        """The repeats of every launch that has them all."""
        return [[self.docs[(k, r)]["output_throughput"] for r in self.reps]
                for k in self.launches if all((k, r) in self.docs for r in self.reps)]

    def rep_means(self) -> dict[int, float]:
        out = {}
        for k in self.launches:
            got = [self.docs[(k, r)]["output_throughput"] for r in self.reps if (k, r) in self.docs]
            if got:
                out[k] = statistics.fmean(got)
        return out

    def residuals(self, covariate: Callable[[dict[str, Any]], float | None]
                  ) -> list[tuple[float, float]]:
        """(covariate, % against the launch's mean) of every repeat."""
        means = self.rep_means()
        return [(x, 100.0 * (d["output_throughput"] / means[k] - 1.0))
                for (k, n), d in self.docs.items()
                if n in self.reps and (x := covariate(d)) is not None]


def level_effects(data: LevelData, *, order: bool = False) -> list[tuple[str, Effect | None]]:
    """Each suspect's effect at this level (None where it was not measured); `order`: (i)
    too, for a run with --interleave."""
    ref = data.rep_means()
    last = data.values(data.reps[-1]) if data.reps else {}
    out = [("b", paired_effect(data.values("converge"), ref)),
           ("c", paired_effect(data.values("sample"), ref)),
           ("d", paired_effect(data.values("again"), last)),
           ("e", paired_effect(data.values("long"), ref)),
           ("f", paired_effect(data.values("nowarm"), ref)),
           ("g", split_effect(data.residuals(lambda d: d["client_cores"]))),
           ("h", split_effect(data.residuals(lambda d: d["monitor"]["others_cores"])))]
    if order:
        predecessor = {d["launch"]: d["predecessor"] for d in data.docs.values()}
        out.append(("i", order_effect(ref, predecessor)))
    return out


def spread_rows(data: LevelData) -> list[tuple[str, list[float], list[float], str]]:
    """The spread of identical launches, per way of measuring: (label, one figure per launch,
    seconds each cost per launch, note)."""
    def seconds(name: str) -> dict[int, float]:
        return data.values(name, "window_s")

    rows = []
    first = data.values("rep0")
    rows.append(("old way, one block", list(first.values()), list(seconds("rep0").values()), ""))
    if len(data.reps) > 1:
        cost = {k: sum(seconds(r).get(k, 0.0) for r in data.reps) for k in data.rep_means()}
        rows.append((f"old way, mean of {len(data.reps)} blocks", list(data.rep_means().values()),
                     list(cost.values()), ""))
    rows.append((f"old way, {LONG}x requests", list(data.values("long").values()),
                 list(seconds("long").values()), ""))
    conv = [d for (_, n), d in data.docs.items() if n == "converge"]
    note = ""
    if conv:
        ok = sum(bool(d["converged"]) for d in conv)
        windows = statistics.median(len(d["windows"]) for d in conv)
        note = f"{ok}/{len(conv)} converged, {windows:.0f} windows"
    rows.append(("converging", list(data.values("converge").values()),
                 list(seconds("converge").values()), note))
    return [r for r in rows if r[1]]


def _num(x: float | None, fmt: str = "{:.1f}", width: int = 7) -> str:
    return f"{'-' if x is None else fmt.format(x):>{width}}"


def level_report(docs: Sequence[dict[str, Any]], level: int) -> list[str]:
    data = LevelData.of(docs, level)
    table = data.table()
    comp = components(table) if table and data.reps else None
    lines = [f"c={level}: {len(data.launches)} launches x {len(data.reps)} repeats"
             + (f", mean {comp.mean:.1f} tok/s" if comp else "")]
    if comp:
        lines += [f"  {'spread':44} {'SD %':>8}",
                  f"  {'within a launch (repeats)':44} {_num(comp.within_pct, '{:.2f}', 8)}   "
                  f"of which prompt sets {_num(comp.prompts_pct, '{:.2f}', 1)}, timing "
                  f"{_num(comp.timing_pct, '{:.2f}', 1)}",
                  f"  {'between launches':44} {_num(comp.launch_pct, '{:.2f}', 8)}   "
                  f"(SD of launch means {_num(comp.launch_means_pct, '{:.2f}', 1)})"]
    within = comp.within_pct if comp else None
    effects = level_effects(data, order=any(d["role"] == "between" for d in docs))
    lines.append(f"  {'suspect':44} {'effect %':>8} {'+-':>6} {'n':>3}  > within")
    for letter, eff in effects:
        if eff is not None:
            lines.append(f"  ({letter}) {SUSPECTS[letter]:40} {eff.pct:8.2f} "
                         f"{_num(eff.spread, '{:.2f}', 6)} {eff.n:3d}  {eff.exceeds(within)}")
    lines.append(f"  {'identical launches':30} {'n':>3} {'median tok/s':>13} {'half-range %':>13}"
                 f" {'s/level':>8}")
    for label, values, secs, note in spread_rows(data):
        lines.append(f"  {label:30} {len(values):3d} {statistics.median(values):13.1f} "
                     f"{_num(half_range_pct(values), '{:.2f}', 13)} "
                     f"{_num(statistics.median(secs) if secs else None, '{:.1f}', 8)}  {note}")
    return lines + engine_report(docs, level)


def load_measurements(out: Path) -> list[dict[str, Any]]:
    """Every finished measurement under `out` (none of a launch set aside, none half-written)."""
    docs = []
    for path in sorted(out.glob("launch-*/c*/*/measurement.json")):
        if ".incomplete" in path.parts[-4] or path.parts[-2].endswith(".part"):
            continue
        if (doc := _read_json(path)) is not None:
            docs.append(doc)
    return docs


def machine_lines(docs: Sequence[dict[str, Any]], levels: Sequence[int]) -> list[str]:
    """(g) and (h) as they were: the load generator's CPU, load average and the busiest other
    processes over every measurement; and how many prompts each level sent twice in a launch."""
    busiest: dict[str, list[float]] = {}
    for d in docs:
        for name, cores in d["monitor"]["others_top"]:
            busiest.setdefault(name, []).append(cores)
    top = sorted(busiest.items(), key=lambda kv: -sum(kv[1]) / len(docs))[:3]
    loads = [d["monitor"]["loadavg_max"] for d in docs if d["monitor"]["loadavg_max"] is not None]
    lines = []
    for c in levels:
        mine = [d for d in docs if d["level"] == c]
        if mine:
            client = [d["client_cores"] for d in mine]
            others = [d["monitor"]["others_cores"] for d in mine]
            seen = sum(d["prompts_seen_before"] for d in mine) / sum(d["prompts_sent"] for d in mine)
            lines.append(f"c={c}: load generator {statistics.median(client):.2f} cores (max "
                         f"{max(client):.2f}); other processes {statistics.median(others):.2f} "
                         f"cores (max {max(others):.2f}); prompts sent before in the launch "
                         f"{100 * seen:.0f}%")
    if loads:
        lines.append(f"load average up to {max(loads):.1f}; busiest other processes (cores, mean "
                     f"over measurements): " + (", ".join(
                         f"{n} {sum(v) / len(docs):.2f}" for n, v in top) or "none"))
    return lines


def _label(spec: dict[str, Any] | None) -> str:
    return TrialConfig(speculative_config=spec).label()


def analyze(out: Path) -> None:
    meta = _read_json(out / "run.json")
    docs = load_measurements(out)
    if meta is None or not docs:
        raise ConfigError(f"{out}: no measurements of `noise_sources.py run` there. Pass the "
                          f"folder given to run as --out.")
    plan = meta["plan"]
    print(f"# noise sources: {Path(plan['model']).name} ({plan['device']}, "
          f"{meta['host']['cores']} cores), {plan['workload']} seed {plan['seed']}, "
          f"{plan['num_prompts']} prompts (requests per level: max(that, "
          f"{plan['requests_per_slot']} x c)) x {plan['output_len']} tokens, temperature "
          f"{plan['temperature']}; config {_label(plan['config'])}"
          + (f", interleaved with {_label(plan['interleave'])}" if plan["interleave"] else "")
          + f"; converging: --stability {plan['stability']} --stability-max-s "
          f"{plan['stability_max_s']}; {meta['distinct_prompts']['main']} distinct prompts")
    print("# effect %: the suspect's throughput against its reference in the same launch "
          "(b c e f: the mean of the repeats; d: the repeat whose prompts it sent again; "
          "g h: repeats in the upper half of CPU in use against the lower; i: launches after "
          "the other config against the rest), mean over launches; +-: SD over launches "
          "(g h i: standard error); > within: larger than one repeat's within-launch SD")
    if any("engine" in d["monitor"] for d in docs):
        print(f"# engine and GPU: each covariate against throughput over every measurement of the "
              f"level; rho: Spearman's; p: a permutation test's; faster/slower half: the "
              f"covariate's mean in each half by throughput; a reading only where p < "
              f"{READING_P} (or a main thread at >= {BOUND_CORES} of a core)")
    for c in plan["levels"]:
        if any(d["level"] == c for d in docs):
            print()
            print("\n".join(level_report(docs, c)))
    print()
    print("\n".join(machine_lines(docs, plan["levels"])))


# --- the command line ------------------------------------------------------------------------
def suspects_option(text: str) -> str:
    """--suspects: letters a-h, comma-separated (i comes with --interleave)."""
    letters = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in letters if x not in SUSPECTS or x == "i"]
    if not letters or bad:
        raise ConfigError(f"--suspects {text!r}: {'unknown ' + ', '.join(bad) if bad else 'none'}"
                          f". Valid: " + "; ".join(f"{k} {v}" for k, v in SUSPECTS.items()
                                                   if k != "i")
                          + ". The order suspect (i) runs with --interleave SPEC_JSON.")
    return "".join(k for k in SUSPECTS if k in letters)


def build_parser(gpu: bool) -> argparse.ArgumentParser:
    d = GPU_DEFAULTS if gpu else CPU_DEFAULTS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="launch and measure (resumes what --out holds)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=500.0,
                   help="stop cleanly before this many seconds (default 500)")
    r.add_argument("--launches", type=int, default=3, help="launches of the config (default 3)")
    r.add_argument("--reps", type=int, default=3, help="(a) repeats per level (default 3)")
    r.add_argument("--suspects", type=suspects_option, default="a,b,c,d,e,f,g,h",
                   help="which to measure, e.g. a,b,f (default all; g and h cost nothing)")
    r.add_argument("--concurrency", type=checks.list_option("concurrency"),
                   default=checks.int_list(d["concurrency"], "concurrency"),
                   help=f"levels (default {d['concurrency']} here)")
    r.add_argument("--num-prompts", type=checks.option("num_prompts"), default=d["num_prompts"],
                   help=f"requests per level: max(this, --requests-per-slot x c) (default "
                   f"{d['num_prompts']} here)")
    r.add_argument("--requests-per-slot", type=checks.option("requests_per_slot"), default=4)
    r.add_argument("--output-len", type=checks.option("output_len"), default=d["output_len"])
    r.add_argument("--workload", default="instructcoder")
    r.add_argument("--dataset-path")
    r.add_argument("--seed", type=checks.option("seed"), default=0,
                   help="the main prompt sample's; (c) draws seed + 1")
    r.add_argument("--temperature", type=checks.option("temperature"), default=0.0)
    r.add_argument("--speculative-config", type=checks.speculative_config, default=None,
                   help="the config launched (default: none, the baseline)")
    r.add_argument("--interleave", type=checks.speculative_config, default=None,
                   help="(i) a config launched between the launches (base, this, base, ...)")
    r.add_argument("--stability", type=checks.option("stability"), default=3.0,
                   help="(b) the converging measurement's target, percent (default 3)")
    r.add_argument("--model")
    r.add_argument("--engine-args", type=checks.command_line("--engine-args"), default=())
    r.add_argument("--launch-s", type=float, default=d["launch_s"],
                   help=f"a launch's duration until one is measured (default {d['launch_s']} "
                   f"here): no launch starts with less left")
    r.add_argument("-v", "--verbose", action="store_true", help="tuner's own lines too")
    a = sub.add_parser("analyze", help="the tables, from what run wrote")
    a.add_argument("out", type=Path)
    return ap


def main() -> None:
    from tuner.measure import machine

    try:
        args = build_parser(machine.has_nvidia_gpu()).parse_args()
        if args.command == "analyze":
            analyze(args.out)
            return
        if args.launches < 1 or args.reps < 1 or args.budget_s <= 0:
            raise ConfigError(f"--launches {args.launches}, --reps {args.reps}, --budget-s "
                              f"{args.budget_s:g}: each must be at least 1 (the budget above 0).")
        if "b" in args.suspects and not args.stability > 0:
            raise ConfigError("--stability 0 with suspect b: the converging measurement needs "
                              "a target above 0 (default 3). Raise it, or drop b.")
        run(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: the engine is stopped; every finished measurement is kept, and "
              "the same command resumes", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
