"""The replay at temperature > 0 against vLLM's counters: does the predicted acceptance length,
with its 90% interval, hold what a sampling engine measures?

`run`: one engine per config (the baseline, six n-gram configs: k 2, 4, 8 x windows 1-3 and
2-5, and suffix decoding where arctic_inference imports), all at once on one GPU, each given
a slice of its memory (GPU_SHARE; --parallel caps how many run at once, one on a CPU). Each
engine serves every case, temperature x workload x level x repeat: one tuner bench of the
same prompts (--seed) with ignore-eos, the temperature sent; requests carry no seed, so
repeats differ by sampling. A case keeps its result.json (vLLM's counters) and tokens.npz,
written whole or not at all; a later call measures only the cases missing.
`analyze` (no engine; the CPU host will do): per case, each config's acceptance length
predicted from the baseline's sampled tokens of the same repeat, with its 90% half-width
(tuner.replay.predict's acceptance_length_pm), what each repeat measured, the config's own
spread (half its repeats' range), the error, and whether the interval holds each measured
value; the replay over the config's own tokens where they are there; then the share held
(target 80%), at temperature 0 apart, and a CSV of every row.
    .venv/bin/python benchmarks/sampled_acceptance.py run --out DIR [--budget-s 420]
        [--temperatures 0.8,1.0] [--workloads instructcoder,sharegpt] [--concurrency 1,8]
    .venv/bin/python benchmarks/sampled_acceptance.py analyze DIR [--csv FILE]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import inspect
import json
import math
import os
import secrets
import shutil
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from noise_sources import (  # noqa: E402  (the sibling benchmark: one home for these)
    TEARDOWN_S,
    Clock,
    bench_running,
    publish,
    stability_settings,
)
from noise_sources import _read_json as read_json  # noqa: E402
from noise_sources import _write_json as write_json  # noqa: E402

from tuner import checks, engine_cmdline  # noqa: E402
from tuner.api import engines
from tuner.errors import ConfigError, TrialFailed  # noqa: E402
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import EngineOptions
from tuner.records.results import BenchResult

# Each engine's share of one GPU when several run at once (vLLM 0.26's flags): a fixed KV
# cache skips vLLM's memory profiling, which other engines' allocations would upset.
GPU_SHARE = (("--kv-cache-memory-bytes", "2G"), ("--gpu-memory-utilization", "0.08"),
             ("--max-num-seqs", "64"))
BASE = "base"
START_S = {"gpu": 180.0, "cpu": 150.0}  # an engine's start, until one is measured


def _ngram(k: int, lo: int, hi: int) -> tuple[str, dict[str, Any]]:
    return (f"ngram-k{k}-w{lo}-{hi}", {"method": "ngram", "num_speculative_tokens": k,
                                       "prompt_lookup_min": lo, "prompt_lookup_max": hi})


def all_configs(*, suffix: bool) -> dict[str, dict[str, Any] | None]:
    """The configs by name, the baseline first."""
    out: dict[str, dict[str, Any] | None] = {BASE: None}
    out.update(_ngram(k, lo, hi) for lo, hi in ((1, 3), (2, 5)) for k in (2, 4, 8))
    if suffix:
        out["suffix-k8"] = {"method": "suffix", "num_speculative_tokens": 8}
    return out


@dataclass(frozen=True)
class Case:
    """One bench every engine runs: the same prompts, sampled at `temperature`."""

    temperature: float
    workload: str
    level: int
    rep: int

    @property
    def name(self) -> str:
        return f"t{self.temperature:g}-{self.workload}-c{self.level}-r{self.rep}"

    @property
    def group(self) -> tuple[float, str, int]:
        return self.temperature, self.workload, self.level


def plan_cases(temperatures: list[float], workloads: list[str], levels: list[int],
               reps: int) -> list[Case]:
    """Every case, repeat by repeat: a budget that ends early leaves whole first repeats."""
    return [Case(t, w, c, r) for r in range(reps) for t in temperatures for w in workloads
            for c in levels]


# --- run: one engine per config, every case against each ------------------------------------
class Fleet:
    """The engines of one run and what they share: the budget, the stop, the longest bench
    per level so far; one API key for all, which the benches send as $OPENAI_API_KEY."""

    def __init__(self, *, out: Path, engine: EngineSpec, args: argparse.Namespace,
                 clock: Clock) -> None:
        self.out, self.engine, self.args, self.clock = out, engine, args, clock
        self.detail = clock.say if args.verbose else (lambda _m: None)
        self.api_key = "tuner-" + secrets.token_hex(16)
        os.environ["OPENAI_API_KEY"] = self.api_key
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.running: dict[str, Any] = {}
        self.case_s: dict[int, float] = {}

    def need(self, case: Case) -> float:
        with self.lock:
            return self.case_s.get(case.level, 0.0)

    def done(self, case: Case, wall_s: float) -> None:
        with self.lock:
            self.case_s[case.level] = max(self.case_s.get(case.level, 0.0), wall_s)

    def stop_all(self) -> None:
        """Stop every engine now: a bench in flight fails, and leaves no result."""
        self.stop.set()
        with self.lock:
            engines = list(self.running.values())
        for eng in engines:
            eng.stop()


def bench_case(fleet: Fleet, name: str, case: Case, *, url: str, served: int) -> dict[str, Any]:
    """One case against the engine of config `name` at `url`; its case.json, also returned.
    `served`: the benches this engine ran before (suffix decoding keeps their outputs)."""
    a = fleet.args
    workload = WorkloadSpec(name=case.workload, num_prompts=a.num_prompts, seed=a.seed,
                            output_len=a.output_len, temperature=case.temperature,
                            ignore_eos=True)
    settings = MeasureSettings(concurrencies=(case.level,), **stability_settings(
        converging=False, pct=0.0, max_s=None))
    out = fleet.out / name / case.name
    t0 = time.monotonic()
    result, _, part = bench_running(url, fleet.engine, workload=workload, settings=settings,
                                    out=out, say=fleet.detail)
    (part / "requests.jsonl").unlink(missing_ok=True)  # timings are not what this measures
    lv = result.levels[0]
    doc = {"config": name, "case": case.name, "temperature": case.temperature,
           "workload": case.workload, "level": case.level, "rep": case.rep,
           "acceptance_length": lv.spec_decode_acceptance_length,
           "acceptance_rate_pct": lv.spec_decode_acceptance_rate,
           "drafts": lv.spec_decode_num_drafts, "draft_tokens": lv.spec_decode_draft_tokens,
           "accepted_tokens": lv.spec_decode_accepted_tokens,
           "per_position": list(lv.spec_decode_per_position_acceptance_rates),
           "output_throughput": lv.output_throughput, "completed": lv.completed,
           "failed": lv.failed, "reused_prompts": lv.reused_prompts, "benches_before": served,
           "wall_s": time.monotonic() - t0}
    publish(part, out, "case.json", doc)
    return doc


def serve(fleet: Fleet, name: str, spec: dict[str, Any] | None, cases: list[Case]) -> None:
    """One config's engine through every case it lacks, while the budget lasts (a thread)."""
    from tuner.measure.engine import Engine

    folder = fleet.out / name
    todo = [c for c in cases if not (folder / c.name / "case.json").exists()]
    start_s = (read_json(folder / "engine.json") or {}).get("start_s") or fleet.args.start_s
    if not todo or fleet.stop.is_set():
        return
    if fleet.clock.left() - TEARDOWN_S < start_s + fleet.need(todo[0]):
        fleet.clock.say(f"{name}: {fleet.clock.left():.0f} s left, too little to start an "
                        f"engine (about {start_s:.0f} s) and measure: not started")
        return
    folder.mkdir(parents=True, exist_ok=True)
    config = TrialConfig(speculative_config=spec)
    eng = Engine(fleet.engine, config, log_path=folder / "engine.log")
    eng.api_key = fleet.api_key
    with fleet.lock:
        fleet.running[name] = eng
    fleet.clock.say(f"{name}: engine starting ({config.label()}), {len(todo)} cases to measure")
    try:
        with eng:
            if not fleet.stop.is_set():
                _serve_cases(fleet, name, eng, todo)
    except TrialFailed as e:
        if not fleet.stop.is_set():
            fleet.clock.say(f"{name}: {e}")
    except Exception as e:  # a thread's error goes to the log; `with` stopped its engine
        if not fleet.stop.is_set():
            fleet.clock.say(f"{name}: {type(e).__name__}: {e}")
    finally:
        with fleet.lock:
            fleet.running.pop(name, None)


def _serve_cases(fleet: Fleet, name: str, eng: Any, todo: list[Case]) -> None:
    limits = engine_cmdline.engine_limits(fleet.engine)
    write_json(fleet.out / name / "engine.json", {
        "config": eng.config.model_dump(mode="json"), "label": eng.config.label(),
        "start_s": eng.info.start_s, "vllm_version": eng.info.vllm_version,
        "limits": limits.model_dump(), "details": eng.info.details})
    fleet.clock.say(f"{name}: engine ready in {eng.info.start_s:.0f} s")
    for served, case in enumerate(todo):
        need = fleet.need(case)
        if fleet.stop.is_set():
            return
        if fleet.clock.left() - TEARDOWN_S < need:
            fleet.clock.say(f"{name}: {fleet.clock.left():.0f} s left, {case.name} takes about "
                            f"{need:.0f} s: stopping this engine")
            return
        doc = bench_case(fleet, name, case, url=eng.url, served=served)
        fleet.done(case, doc["wall_s"])
        al = doc["acceptance_length"]
        fleet.clock.say(f"  {name:16} {case.name:28} acceptance length "
                        f"{'-' if al is None else f'{al:.3f}'}  {doc['wall_s']:.0f} s")


def share_args(user: tuple[str, ...]) -> tuple[str, ...]:
    """GPU_SHARE's flags the user's --engine-args do not set already."""
    given = {a.split("=", 1)[0] for a in user}
    return tuple(x for flag, value in GPU_SHARE if flag not in given for x in (flag, value))


def run(args: argparse.Namespace) -> None:
    from tuner.measure import machine, workloads

    clock = Clock(args.budget_s)
    gpu = machine.has_nvidia_gpu()
    suffix = importlib.util.find_spec("arctic_inference") is not None
    configs = pick_configs(args.configs, suffix=suffix)
    parallel = args.parallel or (len(configs) if gpu else 1)
    extra = tuple(args.engine_args) + (share_args(args.engine_args) if gpu and parallel > 1
                                       else ())
    engine = engines.resolve_engine(EngineOptions(model=args.model, extra_args=extra))
    args.start_s = args.start_s or START_S["gpu" if gpu else "cpu"] * (1.5 if parallel > 2 else 1)
    cases = plan_cases(args.temperatures, args.workloads, args.concurrency, args.reps)
    plan = json.loads(json.dumps({
        "model": engine.model, "engine_args": list(engine.extra_args), "device": engine.device,
        "configs": configs, "temperatures": args.temperatures, "workloads": args.workloads,
        "levels": args.concurrency, "reps": args.reps, "num_prompts": args.num_prompts,
        "output_len": args.output_len, "seed": args.seed}))
    previous = read_json(args.out / "run.json")
    if previous is not None and previous.get("plan") != plan:
        changed = sorted(k for k in plan if previous["plan"].get(k) != plan[k])
        raise ConfigError(f"--out {args.out}: it holds a run with other settings "
                          f"({', '.join(changed)} differ). Resume it with the same options, "
                          f"or pass another --out.")
    args.out.mkdir(parents=True, exist_ok=True)
    if previous is None:
        write_json(args.out / "run.json", {
            "plan": plan, "limits": engine_cmdline.engine_limits(engine).model_dump(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "suffix_available": suffix})
    clock.say(f"sampled acceptance: {len(configs)} configs x {len(cases)} cases, {parallel} "
              f"engine(s) at once, budget {args.budget_s:.0f} s -> {args.out}")
    fleet = Fleet(out=args.out, engine=engine, args=args, clock=clock)
    # transformers' lazy imports are not thread-safe: load a tokenizer here, before threads do.
    workloads.load_tokenizer(engine.tokenizer or engine.model)
    names = list(configs)
    try:
        for i in range(0, len(names), parallel):  # in waves: the baseline's first
            _wave(fleet, {n: configs[n] for n in names[i:i + parallel]}, cases)
    finally:
        fleet.stop_all()
        for part in args.out.glob("*/*.part"):
            shutil.rmtree(part, ignore_errors=True)
    measured_summary(args.out, configs, cases)


def _wave(fleet: Fleet, configs: dict[str, Any], cases: list[Case]) -> None:
    """Engines for `configs` at once, each a thread; stopped at the budget's end."""
    threads = [threading.Thread(target=serve, args=(fleet, name, spec, cases), daemon=True,
                                name=name) for name, spec in configs.items()]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.5)
        if fleet.clock.left() < TEARDOWN_S / 2 and not fleet.stop.is_set():
            fleet.clock.say("the budget is at its end: stopping every engine")
            fleet.stop_all()


def pick_configs(names: str | None, *, suffix: bool) -> dict[str, dict[str, Any] | None]:
    """--configs: names of all_configs, comma-separated (default: all of them); the baseline
    is always measured, first, since every prediction replays its tokens."""
    known = all_configs(suffix=suffix)
    if not names:
        return known
    asked = [n.strip() for n in names.split(",") if n.strip()]
    bad = [n for n in asked if n not in known]
    if bad:
        why = " (suffix needs arctic_inference, which does not import here)" if any(
            n.startswith("suffix") for n in bad) else ""
        raise ConfigError(f"--configs: unknown {', '.join(bad)}{why}. Valid: "
                          f"{', '.join(known)}.")
    return {n: known[n] for n in [BASE, *asked] if n in known}


def measured_summary(out: Path, configs: dict[str, Any], cases: list[Case]) -> None:
    """What vLLM's counters said, per config and temperature; then how to read it."""
    temps = sorted({c.temperature for c in cases})
    print(f"{'config':18} {'cases':>7} " + " ".join(f"{f'AL at T={t:g}':>11}" for t in temps))
    for name in configs:
        docs = [d for c in cases if (d := read_json(out / name / c.name / "case.json"))]
        cells = []
        for t in temps:
            al = [d["acceptance_length"] for d in docs
                  if d["temperature"] == t and d["acceptance_length"] is not None]
            cells.append(f"{statistics.fmean(al):11.3f}" if al else f"{'-':>11}")
        print(f"{name:18} {len(docs):3d}/{len(cases):<3d} " + " ".join(cells))
    print(f"AL: vLLM's mean acceptance length over the cases measured. The replay's "
          f"predictions: benchmarks/sampled_acceptance.py analyze {out}")


# --- analyze: the replay over each baseline case against every config's counters ------------
def covered(pred: float | None, pm: float | None, measured: float | None) -> bool | None:
    """Whether pred ± pm holds `measured`; None where any of them is missing."""
    if any(x is None or not math.isfinite(x) for x in (pred, pm, measured)):
        return None
    return abs(measured - pred) <= pm


def with_errors(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` (one per case, config and repeat) with err_pct, covered and spread: the
    config's own spread at that case, half the range of its repeats' measured values."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r["measured"] is not None:
            groups.setdefault(_group_key(r), []).append(r["measured"])
    out = []
    for r in rows:
        runs = groups.get(_group_key(r), [])
        err = (100.0 * (r["pred"] - r["measured"]) / r["measured"]
               if r["pred"] is not None and r["measured"] else None)
        out.append({**r, "err_pct": err, "covered": covered(r["pred"], r["pm"], r["measured"]),
                    "spread": (max(runs) - min(runs)) / 2 if len(runs) > 1 else None})
    return out


def _group_key(r: dict[str, Any]) -> tuple:
    return r["temperature"], r["workload"], r["concurrency"], r["config"]


def coverage(rows: list[dict[str, Any]], *, sampled: bool) -> tuple[int, int]:
    """(rows whose interval holds the measured value, rows with both) at temperature > 0
    (`sampled`) or at 0."""
    judged = [r["covered"] for r in rows if (r["temperature"] > 0) == sampled
              and r["covered"] is not None]
    return sum(judged), len(judged)


def _cell(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def case_tables(rows: list[dict[str, Any]]) -> list[str]:
    """Per case (temperature, workload, level): one line per config, its repeats side by side."""
    lines: list[str] = []
    cases = sorted({(r["temperature"], r["workload"], r["concurrency"]) for r in rows})
    for t, w, c in cases:
        mine = [r for r in rows if (r["temperature"], r["workload"], r["concurrency"]) == (t, w, c)]
        reps = sorted({r["rep"] for r in mine})
        lines += ["", f"T={t:g} {w} c={c} ({len(reps)} repeat{'s' if len(reps) > 1 else ''}; "
                      f"per repeat: predicted ± from the baseline's repeat, measured, error)",
                  f"  {'config':16} {'predicted ±':>16} {'measured':>9} {'err %':>7} {'held':>4} "
                  f"{'own':>6}   {'spread':>6}"]
        for config in dict.fromkeys(r["config"] for r in mine):
            by_rep = {r["rep"]: r for r in mine if r["config"] == config}
            for i, rep in enumerate(reps):
                r = by_rep.get(rep)
                if r is None:
                    continue
                held = {True: "yes", False: "NO", None: "-"}[r["covered"]]
                pred = f"{_cell(r['pred'])} ±{_cell(r['pm'])}"
                lines.append(f"  {config if i == 0 else '':16} {pred:>16} "
                             f"{_cell(r['measured']):>9} {_cell(r['err_pct'], '{:+.1f}'):>7} "
                             f"{held:>4} {_cell(r['own_replay']):>6}   "
                             f"{_cell(r['spread']) if i == 0 else '':>6}")
    return lines


def _level(result_json: Path) -> Any:
    doc = json.loads(result_json.read_text())
    return BenchResult.model_validate({k: doc[k] for k in ("config", "engine", "levels")}).levels[0]


def _predict(capture: Any, configs: list[TrialConfig], measured: list[Any], *, limits: dict,
             case: Case, memo: dict) -> Any:
    """tuner.replay.predict over one baseline case, told its temperature (a predict without
    that parameter gives no ±: then nothing is judged)."""
    from tuner.replay.predict import predict

    extra = ({"temperature": case.temperature}
             if "temperature" in inspect.signature(predict).parameters else {})
    return predict(capture, configs, measured, max_model_len=limits["max_model_len"],
                   max_num_seqs=limits["max_num_seqs"], levels=[case.level], memo=memo, **extra)


def _own_replay(folder: Path, spec: dict[str, Any], *, limits: dict, level: int
                ) -> float | None:
    """The replay over the config's own sampled tokens: vLLM's counters, if the replay counts
    as the engine does whatever the sampler did."""
    from tuner.replay import acceptance
    from tuner.tokens import TokenCapture

    path = folder / "tokens.npz"
    if not path.exists():
        return None
    acc = acceptance.replay(TokenCapture.load(path), TrialConfig(speculative_config=spec),
                            max_model_len=limits["max_model_len"],
                            max_num_seqs=limits["max_num_seqs"], levels=[level]).get(level)
    return acc.acceptance_length if acc is not None else None


def prediction_rows(out: Path, plan: dict[str, Any], limits: dict) -> list[dict[str, Any]]:
    """One row per case, speculative config and repeat: predicted (with ±), measured, own."""
    from tuner.replay.measured import MeasuredTrial
    from tuner.tokens import TokenCapture

    configs = {n: TrialConfig(speculative_config=s) for n, s in plan["configs"].items() if s}
    rows, memo = [], {}
    for case in plan_cases(plan["temperatures"], plan["workloads"], plan["levels"],
                           plan["reps"]):
        base = out / BASE / case.name
        if not (base / "tokens.npz").exists():
            continue
        cap = TokenCapture.load(base / "tokens.npz")
        measured = [MeasuredTrial(0, TrialConfig(), "baseline",
                                  {case.level: _level(base / "result.json")}, cap)]
        pred = _predict(cap, list(configs.values()), measured, limits=limits, case=case,
                        memo=memo)
        by_key = {r.key: r for r in pred.rows if r.concurrency == case.level}
        for name, cfg in configs.items():
            doc = read_json(out / name / case.name / "case.json")
            row = by_key.get(cfg.key())
            rows.append({"temperature": case.temperature, "workload": case.workload,
                         "concurrency": case.level, "rep": case.rep, "config": name,
                         "pred": row.acceptance_length if row else None,
                         "pm": row.acceptance_length_pm if row else None,
                         "measured": doc["acceptance_length"] if doc else None,
                         "own_replay": _own_replay(out / name / case.name, cfg.speculative_config,
                                                   limits=limits, level=case.level)
                         if doc else None,
                         "benches_before": doc["benches_before"] if doc else None})
    return with_errors(rows)


def analyze(out: Path, csv_path: Path | None) -> None:
    meta = read_json(out / "run.json")
    if meta is None:
        raise ConfigError(f"{out}: no run.json of `sampled_acceptance.py run` there. Pass the "
                          f"folder given to run as --out.")
    plan = meta["plan"]
    rows = prediction_rows(out, plan, meta["limits"])
    if not rows:
        raise ConfigError(f"{out}: no baseline case with token ids yet (base/*/tokens.npz). "
                          f"Run `sampled_acceptance.py run --out {out}` first.")
    print(f"# sampled acceptance: {Path(plan['model']).name} ({plan['device']}), "
          f"{plan['num_prompts']} prompts x {plan['output_len']} tokens (seed {plan['seed']}, "
          f"ignore-eos), {plan['reps']} repeats; predicted: the replay over the baseline's "
          f"sampled tokens of the same repeat, ± a 90% interval for a measured run; measured: "
          f"vLLM's counters; held: the interval holds the measured value; own: the replay over "
          f"the config's own tokens; spread: half the range of the config's repeats")
    print("\n".join(case_tables(rows)))
    print()
    defect = _known_defect(plan["device"], max(plan["temperatures"]))
    if defect:
        print(defect)
    for sampled, label in ((True, "temperature > 0"), (False, "temperature 0")):
        held, total = coverage(rows, sampled=sampled)
        if total:
            print(f"held at {label}: {held}/{total} = {100 * held / total:.0f}% "
                  + ("(target 80%)" if sampled else ""))
    errors = [abs(r["err_pct"]) for r in rows if r["err_pct"] is not None]
    if errors:
        print(f"|error| median {statistics.median(errors):.1f}%, max {max(errors):.1f}% over "
              f"{len(errors)} rows")
    if meta.get("suffix_available") and any(r["config"].startswith("suffix") for r in rows):
        print("suffix: each engine served the same prompts in earlier cases (benches_before in "
              "the CSV); suffix decoding keeps those outputs, the replay does not")
    path = csv_path or out / "sampled_acceptance.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"rows: {path}")


def _known_defect(device: str, temperature: float) -> str | None:
    """tuner's warning for a build whose sampler breaks the replay's premise (None where
    there is none, or on a tuner without the warning)."""
    try:
        from tuner.replay.sampling import known_defect
    except ImportError:
        return None
    return known_defect(device=device, temperature=temperature)


# --- the command line ------------------------------------------------------------------------
def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(not (0.0 <= v <= 2.0) for v in values):
        raise ConfigError(f"--temperatures {text!r}: give temperatures from 0 to 2 separated "
                          f"by commas, e.g. --temperatures 0.8,1.0.")
    return values


def _names(text: str) -> list[str]:
    from tuner.measure import workloads

    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in workloads.BUNDLED]
    if not names or bad:
        raise ConfigError(f"--workloads {text!r}: each must be a bundled workload: "
                          f"{', '.join(workloads.BUNDLED)}.")
    return names


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="launch the engines and measure (resumes what --out holds)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=420.0,
                   help="stop cleanly before this many seconds (default 420)")
    r.add_argument("--temperatures", type=_floats, default=[0.8, 1.0])
    r.add_argument("--workloads", type=_names, default=["instructcoder", "sharegpt"])
    r.add_argument("--concurrency", type=checks.list_option("concurrency"), default=(1, 8))
    r.add_argument("--reps", type=int, default=2, help="repeats of each case (default 2)")
    r.add_argument("--num-prompts", type=checks.option("num_prompts"), default=32)
    r.add_argument("--output-len", type=checks.option("output_len"), default=128)
    r.add_argument("--seed", type=checks.option("seed"), default=0)
    r.add_argument("--configs", help="names to measure besides the baseline, comma-separated "
                   "(default: all; see all_configs)")
    r.add_argument("--parallel", type=int, default=0,
                   help="engines at once (default: all on a GPU, one on a CPU)")
    r.add_argument("--start-s", type=float, default=0.0,
                   help="an engine's start until one is measured (default 180 s on a GPU, "
                   "x1.5 with more than two at once; 150 s on a CPU)")
    r.add_argument("--model")
    r.add_argument("--engine-args", type=checks.command_line("--engine-args"), default=())
    r.add_argument("-v", "--verbose", action="store_true", help="tuner's own lines too")
    a = sub.add_parser("analyze", help="the replay against the counters (no engine)")
    a.add_argument("out", type=Path)
    a.add_argument("--csv", type=Path, help="default: DIR/sampled_acceptance.csv")
    return ap


def main() -> None:
    try:
        args = build_parser().parse_args()
        if args.command == "analyze":
            analyze(args.out, args.csv)
            return
        if args.reps < 1 or args.parallel < 0 or args.budget_s <= 0:
            raise ConfigError(f"--reps {args.reps}, --parallel {args.parallel}, --budget-s "
                              f"{args.budget_s:g}: repeats at least 1, parallel 0 (all) or "
                              f"more, the budget above 0.")
        run(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: every engine is stopped; every finished case is kept, and the same "
              "command resumes", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
