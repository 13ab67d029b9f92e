"""Fault drill: inject every fault the tuner must survive and prove that nothing is lost.

Faults about the engine run on the real vLLM CPU engine with the embedded model; the others
(and, with --fake-only, all of them) on the scripted fake engine (tuner/testing/fake_engine.py). After
each fault the drill checks three things: the expected outcome was recorded as data (a FAIL
trial with its reason, or errored records counted); no trial was lost (every trial that ran
is in storage, and a resumed study kept every completed trial); and nothing was left behind:
no live process carrying this drill's marker in its environment (every engine the drill starts
carries it: tuner.testing.fake_engine, vllm.entrypoints and vLLM's renamed VLLM::EngineCore children),
none in the engine's process group, and nothing listening on the engine's port.

    python scripts/fault_drill.py              # real-engine faults included (several minutes)
    python scripts/fault_drill.py --fake-only  # the fake engine stands in for vLLM (2-3 min)

Prints one row per fault; exit status 1 if any fault fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tuner
from tuner import api
from tuner.measure import trial as runner
from tuner.measure.engine import TEARDOWN_GRACE_S
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import (
    EngineSpec,
    MeasureSettings,
    Prompt,
    TrialConfig,
    Workload,
    WorkloadSpec,
)
from tuner.records.options import EngineOptions, OptimizeOptions
from tuner.records.results import TrialOutcome
from tuner.search import study as st
from tuner.testing import leaks
from tuner.testing.fake_engine import SCRIPT_ENV

# Engines and drivers the drill starts import the same tuner as this script.
ROOT = Path(tuner.__file__).resolve().parent.parent

MARK = "TUNER_FAULT_DRILL"
RUN = uuid.uuid4().hex[:10]
INTERRUPTED = "tuner: interrupted; engines were stopped, finished results are kept."
BAD_WINDOW = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
              "prompt_lookup_max": 2}
VLLM_REASON = "prompt_lookup_min=5 must be <= prompt_lookup_max=2"
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


@dataclass
class Outcome:
    """What one fault did: what was seen, whether it is what we expected, what was lost, and
    which engine groups and ports must be gone afterwards."""

    observed: str
    ok: bool
    lost: int = 0
    pgids: list[int] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)


@dataclass
class Row:
    fault: str
    engine: str
    expected: str
    observed: str
    lost: int
    leftover: int
    ok: bool
    seconds: float
    leftovers: list[str]


# --- processes, groups, ports: what "nothing left behind" means (tuner.testing.leaks) ----------
def marked_processes(value_prefix: str = RUN) -> list[str]:
    return leaks.marked_processes(MARK, value_prefix)


def leftovers(pgids: list[int], ports: list[int], *, wait_s: float = 10.0) -> list[str]:
    """What survived; a killed driver's watchdog needs a moment to tear the tree down."""
    return leaks.leftovers(MARK, RUN, pgids=pgids, ports=ports, wait_s=wait_s)


group_members, listening, engine_of, wait_for = (leaks.group_members, leaks.listening,
                                                 leaks.engine_of, leaks.wait_for)


# --- engines and workloads ---------------------------------------------------------------------
class Drill:
    def __init__(self, out: Path) -> None:
        self.out = out
        self._real_workload: Workload | None = None

    def dir(self, name: str) -> Path:
        path = self.out / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def fake(fault: str, **script) -> EngineSpec:
        spec_fields = {k: script.pop(k) for k in list(script) if k in EngineSpec.model_fields}
        script = {"ttft_ms": 5.0, "tpot_ms": 1.0, "startup_s": 0.0, **script}
        return EngineSpec(**{
            "model": "fake-model", "served_model_name": "fake",
            "vllm_cmd": (sys.executable, "-m", "tuner.testing.fake_engine"),
            "ready_timeout_s": 15.0, "request_timeout_s": 10.0, "level_timeout_s": 60.0,
            "tokenizer": str(EMBEDDED_TOKENIZER), **spec_fields,
            "env": {SCRIPT_ENV: json.dumps(script), "PYTHONPATH": PYTHONPATH,
                    MARK: f"{RUN}:{fault}"}})

    @staticmethod
    def real(fault: str, **spec_fields) -> EngineSpec:
        spec = api.resolve_engine(EngineOptions(ready_timeout_s=900.0, request_timeout_s=120.0,
                                                env={MARK: f"{RUN}:{fault}"}))
        return spec.model_copy(update=spec_fields)

    @staticmethod
    def fake_workload(n: int = 3, output_len: int = 12) -> Workload:
        prompts = tuple(Prompt(prompt=f"p{i} a b c", prompt_len=5, output_len=output_len)
                        for i in range(n))
        return Workload(spec=WorkloadSpec(name="random", num_prompts=n), prompts=prompts)

    def real_workload(self, spec: EngineSpec) -> Workload:
        if self._real_workload is None:
            from tuner.measure import workloads

            self._real_workload = workloads.load(
                WorkloadSpec(name="instructcoder", num_prompts=2, output_len=48),
                tokenizer=spec.tokenizer or spec.model)
        return self._real_workload


def _recorded(outcome: TrialOutcome) -> int:
    """Trials lost by one measure_outcome: 0 when it came back as a result or a failure."""
    return 0 if (outcome.result is not None or outcome.failure is not None) else 1


def _failure(outcome: TrialOutcome) -> tuple[str, str]:
    f = outcome.failure
    return (f.kind, f.reason) if f is not None else ("(no failure)", "")


def _short(text: str, n: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


# --- faults ------------------------------------------------------------------------------------
def crash_at_start(d: Drill, real: bool) -> Outcome:
    spec = d.real("crash") if real else d.fake("crash", child_process=True)
    wl = d.real_workload(spec) if real else d.fake_workload()
    out = runner.measure_outcome(spec, TrialConfig(speculative_config=BAD_WINDOW), wl,
                                 MeasureSettings(), str(d.dir("crash")))
    kind, reason = _failure(out)
    m = re.search(r"after (\d+ s), before /health answered: (?:.*?Value error, )?(.*)$", reason)
    said = f"exit after {m[1]}: {_short(m[2], 80)}" if m else _short(reason)
    return Outcome(f"{kind}, {said}",
                   kind == "engine_crashed" and VLLM_REASON in reason, _recorded(out))


def killed_mid_measurement(d: Drill, real: bool) -> Outcome:
    trial_dir = d.dir("sigkill")
    log = trial_dir / "engine.log"
    if not real:
        spec = d.fake("sigkill", child_process=True, die_after_requests=4, tpot_ms=5)
        out = runner.measure_outcome(spec, TrialConfig(), d.fake_workload(output_len=20),
                                     MeasureSettings(num_requests=12), str(trial_dir))
        kind, reason = _failure(out)
        pid_port = engine_of(log)
        return Outcome(f"{kind}: {_short(reason)} (fake die_after_requests=4)",
                       kind == "engine_died", _recorded(out),
                       pgids=[pid_port[0]] if pid_port else [],
                       ports=[pid_port[1]] if pid_port else [])
    spec = d.real("sigkill")
    killed: dict[str, float] = {}
    done = threading.Event()

    def killer() -> None:
        # The first GET /metrics after start-up is the scrape between warm-up and the level.
        if not wait_for(log, "GET /metrics", after="Application startup complete",
                        timeout_s=900, stop=done):
            return
        time.sleep(3.0)
        pid_port = engine_of(log)
        if pid_port and not done.is_set():
            pgid = os.getpgid(pid_port[0])
            killed.update(pgid=pgid, port=pid_port[1], members=len(group_members(pgid)))
            os.killpg(pgid, signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out = runner.measure_outcome(spec, TrialConfig(), d.real_workload(spec),
                                 MeasureSettings(concurrencies=(1,), num_requests=6),
                                 str(trial_dir))
    done.set()
    thread.join(timeout=5)
    kind, reason = _failure(out)
    if not killed:
        return Outcome(f"the engine was never killed ({kind or 'completed'})", False,
                       _recorded(out))
    return Outcome(f"{kind}: {_short(reason)} (killpg SIGKILL of {int(killed['members'])} "
                   f"processes 3 s into the level)", kind == "engine_died", _recorded(out),
                   pgids=[int(killed["pgid"])], ports=[int(killed["port"])])


def hang_before_health(d: Drill, real: bool) -> Outcome:
    trial_dir = d.dir("hang")
    if not real:
        spec = d.fake("hang", hang_before_health=True, child_process=True, ready_timeout_s=3.0)
        t0 = time.monotonic()
        out = runner.measure_outcome(spec, TrialConfig(), d.fake_workload(), MeasureSettings(),
                                     str(trial_dir))
        kind, reason = _failure(out)
        said = "no /health within 3 s" if "within 3 s" in reason else _short(reason, 60)
        return Outcome(f"{kind}: {said}; group reaped, {time.monotonic() - t0:.0f} s in all",
                       kind == "engine_start_timeout", _recorded(out))
    ready_s = 20.0
    spec = d.real("hang", ready_timeout_s=ready_s)
    stopped: dict[str, int] = {}
    done = threading.Event()

    def stopper() -> None:
        # SIGSTOP the engine's group the moment its leader has exec'd (its environment then
        # carries the marker; before exec it is a copy of ours): a hang vLLM cannot produce
        # on demand. The engine is a child of its watchdog, a child of our main thread.
        needle = f"{MARK}={RUN}:hang".encode()
        children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
        while not done.is_set():
            kids = children.read_text().split()
            for k in list(kids):
                try:
                    kids += Path(f"/proc/{k}/task/{k}/children").read_text().split()
                except OSError:
                    continue
            for p in kids:
                try:
                    if needle in Path(f"/proc/{p}/environ").read_bytes().split(b"\0"):
                        pgid = os.getpgid(int(p))
                        os.killpg(pgid, signal.SIGSTOP)
                        stopped.update(pgid=pgid)
                        return
                except OSError:
                    continue
            time.sleep(0.005)

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    t0 = time.monotonic()
    out = runner.measure_outcome(spec, TrialConfig(), d.real_workload(spec), MeasureSettings(),
                                 str(trial_dir))
    total_s = time.monotonic() - t0
    done.set()
    thread.join(timeout=5)
    kind, _ = _failure(out)
    reap_s = max(0.0, total_s - ready_s)
    ok = (kind == "engine_start_timeout" and bool(stopped)
          and reap_s < TEARDOWN_GRACE_S / 2)  # SIGCONT: no waiting out the grace period
    what = "SIGSTOPped group" if stopped else "group (never stopped!)"
    return Outcome(f"{kind} after {ready_s:.0f} s; {what} reaped in about {reap_s:.1f} s",
                   ok, _recorded(out), pgids=[stopped["pgid"]] if stopped else [])


def _study_lost(study, n_trials: int) -> int:
    from optuna.trial import TrialState

    running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    return running + max(0, n_trials - st.counted_trials(study))


def _optimize(d: Drill, name: str, spec: EngineSpec, *, n_trials: int, **kw):
    return api.optimize(OptimizeOptions(
        workload=WorkloadSpec(name="instructcoder", num_prompts=2, output_len=kw.pop("out", 8)),
        engine=spec, space_name="ngram", settings=kw.pop("settings", MeasureSettings()),
        out_dir=d.dir(name), study_name=name, n_trials=n_trials,
        objectives=["output_throughput"], target_concurrency=1, constraints={}, **kw),
        say=lambda _m: None)


def stalled_requests(d: Drill, real: bool) -> Outcome:
    spec = d.fake("stall", stall_requests=True, request_timeout_s=1.0)
    study = _optimize(d, "stall", spec, n_trials=2,
                      settings=MeasureSettings(num_requests=2))
    fails = [t.user_attrs.get("failure", {}) for t in study.trials if t.state.is_finished()]
    ok = (len(fails) == 2 and all(f.get("kind") == "measurement_failed"
                                  and "timed out after 1 s" in f.get("reason", "") for f in fails))
    m = re.search(r"(\d+ of \d+) requests failed \(first error: (timed out after \d+ s)",
                  fails[0].get("reason", "") if fails else "")
    said = f"{m[1]} requests {m[2]}" if m else _short(fails[0].get("reason", "") if fails else "")
    return Outcome(f"{len(fails)}/2 trials FAIL ({fails[0].get('kind') if fails else '-'}): "
                   f"{said}", ok, _study_lost(study, 2))


def errors_below_limit(d: Drill, real: bool) -> Outcome:
    # Server request numbers 2..31 are measured (1 is the warm-up): 10 and 20 stream a broken
    # chunk, 15 and 30 answer HTTP 500: 4 of 30 fail, under the 20 % limit.
    spec = d.fake("errors-few", malformed_every=10, http_error_every=15)
    out = runner.measure_outcome(spec, TrialConfig(), d.fake_workload(),
                                 MeasureSettings(num_requests=30), str(d.dir("errors-few")))
    if out.result is None:
        kind, reason = _failure(out)
        return Outcome(f"{kind}: {_short(reason)}", False, _recorded(out))
    (level,) = out.result.levels
    kinds = sorted({"malformed" if "malformed" in e else e.split(":")[0] for e in level.errors})
    return Outcome(f"trial measured; {level.failed}/{level.num_requests} errored records "
                   f"counted ({', '.join(kinds)})",
                   level.failed == 4 and level.completed == 26, _recorded(out))


def errors_above_limit(d: Drill, real: bool) -> Outcome:
    spec = d.fake("errors-many", malformed_every=2, http_error_every=3)
    out = runner.measure_outcome(spec, TrialConfig(), d.fake_workload(),
                                 MeasureSettings(num_requests=12), str(d.dir("errors-many")))
    kind, reason = _failure(out)
    m = re.search(r"(\d+) of (\d+) requests failed", reason)
    ok = kind == "measurement_failed" and bool(m) and int(m[1]) > 0.2 * int(m[2])
    records = [json.loads(line) for line in
               (d.out / "errors-many" / "requests.jsonl").read_text().splitlines()]
    kinds = sorted({"malformed" if "malformed" in r["error"] else r["error"].split(":")[0]
                    for r in records if r["error"] and not r["warmup"]})
    said = f"{m[0]} ({', '.join(kinds)})" if m else _short(reason, 80)
    return Outcome(f"{kind}: {said}", ok, _recorded(out))


def port_taken(d: Drill, real: bool) -> Outcome:
    import tuner.measure.engine

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real_free_port = tuner.measure.engine.free_port
    handed = iter([taken])
    tuner.measure.engine.free_port = lambda host="127.0.0.1": next(handed, None) or real_free_port(host)
    trial_dir = d.dir("port")
    try:
        out = runner.measure_outcome(d.fake("port"), TrialConfig(), d.fake_workload(n=2),
                                     MeasureSettings(), str(trial_dir))
    finally:
        tuner.measure.engine.free_port = real_free_port
        holder.close()
    log = (trial_dir / "engine.log").read_text(errors="replace")
    pid_port = engine_of(trial_dir / "engine.log")
    port = pid_port[1] if pid_port else None
    ok = out.result is not None and "address already in use" in log.lower() and port not in (None, taken)
    seen = "address already in use" if "address already in use" in log.lower() else "no bind error"
    return Outcome(f"port {taken} held: {seen}; retried, measured on port {port}", ok,
                   _recorded(out), ports=[port] if port else [])


def _driver_cmd(out: Path, fault: str, n_trials: int = 3) -> list[str]:
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0})
    return [sys.executable, "-m", "tuner", "optimize", "--model", str(EMBEDDED_TOKENIZER),
            "--vllm-cmd", f"{sys.executable} -m tuner.testing.fake_engine",
            f"--engine-args=--fake-script '{script}'", "--engine-env", f"{MARK}={RUN}:{fault}",
            "--space", "ngram", "--n-trials", str(n_trials), "--num-prompts", "2",
            "--output-len", "24", "--concurrency", "1", "--output-dir", str(out), "--no-report"]


def driver_signal(d: Drill, sig: signal.Signals) -> Outcome:
    from optuna.trial import TrialState

    fault = f"driver-{sig.name}"
    out = d.out / fault
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    proc = subprocess.Popen(_driver_cmd(out, fault), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=env, cwd=ROOT)
    log = out / "trials" / "1" / "engine.log"
    try:
        if not wait_for(log, "Application startup complete", timeout_s=180):
            proc.kill()
            return Outcome("trial 1 never started its engine", False, 1)
        time.sleep(0.5)  # into trial 1's warm-up/measurement
        os.kill(proc.pid, sig)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    pid_port = engine_of(log)
    pgids, ports = ([pid_port[0]], [pid_port[1]]) if pid_port else ([], [])
    notes, ok = [], True
    if sig == signal.SIGINT:
        after = [ln for ln in output.split("[1/", 1)[-1].splitlines()[1:]
                 if ln.strip() and not ln.startswith("  trial 1: ")]  # trial 1's progress
        one_line = after == [INTERRUPTED]
        ok &= proc.returncode == 130 and one_line and "Traceback" not in output
        notes.append(f"exit {proc.returncode}, "
                     f"{'1-line message' if one_line else f'{len(after)} lines after SIGINT'}"
                     f"{', TRACEBACK' if 'Traceback' in output else ', no traceback'}")
    else:
        ok &= proc.returncode == -signal.SIGKILL
        notes.append(f"exit {proc.returncode}")
    # Engines must be gone before the resume starts new ones.
    left = leftovers(pgids, ports)
    if left:
        return Outcome("; ".join(notes) + f"; left behind: {left[:2]}", False, 0, pgids, ports)
    before = st.open_existing(out)
    done = {t.number: t.values for t in before.trials if t.state == TrialState.COMPLETE}
    interrupted = [t for t in before.trials if t.state == TrialState.RUNNING]
    r = subprocess.run(_driver_cmd(out, fault), capture_output=True, text=True, timeout=600,
                       env=env, cwd=ROOT)
    after_study = st.open_existing(out)
    changed = sum(1 for n, v in done.items() if after_study.trials[n].values != v)
    retried = [t.number for t in after_study.trials if interrupted
               and t.params == interrupted[0].params and t.number > interrupted[0].number
               and t.state == TrialState.COMPLETE]
    died = [t.number for t in after_study.trials
            if t.user_attrs.get("failure", {}).get("kind") == "driver_died"]
    lost = changed + _study_lost(after_study, 3)
    ok &= (r.returncode == 0 and "Resuming" in r.stderr and bool(retried)
           and died == [t.number for t in interrupted] and len(interrupted) == 1)
    notes.append(f"resume exit {r.returncode}: {len(done)} completed trial(s) intact"
                 f"{f' ({changed} CHANGED)' if changed else ''}, interrupted trial "
                 f"{died} driver_died, retried as {retried}")
    return Outcome("; ".join(notes), ok, lost, pgids, ports)


def ray_worker_dies(d: Drill, real: bool) -> Outcome:
    import ray

    out = d.out / "ray"
    killed: dict[str, int] = {}
    done = threading.Event()

    def kill_worker_of_trial_1() -> None:
        log = out / "trials" / "1" / "engine.log"
        if not wait_for(log, "Application startup complete", timeout_s=300, stop=done):
            return
        time.sleep(0.5)
        pid_port = engine_of(log)
        if pid_port is None:
            return
        # The engine's parent is its watchdog (tuner/measure/watchdog.py), whose parent is the worker.
        watchdog = int(Path(f"/proc/{pid_port[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        worker = int(Path(f"/proc/{watchdog}/stat").read_text().rsplit(")", 1)[1].split()[1])
        killed.update(engine=pid_port[0], port=pid_port[1], worker=worker)
        os.kill(worker, signal.SIGKILL)

    thread = threading.Thread(target=kill_worker_of_trial_1, daemon=True)
    thread.start()
    try:
        study = _optimize(d, "ray", d.fake("ray", tpot_ms=40), n_trials=3, out=24,
                          logical_gpus=1, gpus_per_trial=1)
    finally:
        done.set()
        ray.shutdown()
    thread.join(timeout=5)
    if not killed:
        return Outcome("the Ray worker was never killed", False, _study_lost(study, 3))
    f = study.trials[1].user_attrs.get("failure", {})
    counted = st.counted_trials(study)
    ok = f.get("kind") == "worker_died" and counted == 3
    m = re.search(r"Ray worker failed: (\w+)", f.get("reason", ""))
    return Outcome(f"trial 1 FAIL ({f.get('kind')}: {m[1] if m else f.get('reason', '?')}); "
                   f"study went on, {counted}/3 trials recorded", ok, _study_lost(study, 3),
                   pgids=[killed["engine"]], ports=[killed["port"]])


# --- the drill ---------------------------------------------------------------------------------
Fault = tuple[str, str, str, Callable[[Drill, bool], Outcome]]


def rejected_proposed_again(d: Drill, real: bool) -> Outcome:
    from optuna.trial import TrialState

    name = "rejected-again"
    space = d.out / f"{name}.yaml"
    # min 5 > max 2: refused at start like vLLM; k=2 proposed twice (two equal start points).
    space.write_text("methods:\n  ngram:\n    num_speculative_tokens: {type: int, low: 2, high: 3}"
                     "\n    prompt_lookup_min: 5\n    prompt_lookup_max: 2\nstart_points:\n"
                     "  - {method: ngram, num_speculative_tokens: 2}\n"
                     "  - {method: ngram, num_speculative_tokens: 2}\n")
    study = api.optimize(OptimizeOptions(
        workload=WorkloadSpec(name="instructcoder", num_prompts=2, output_len=8),
        engine=d.fake(name), space_name=str(space), settings=MeasureSettings(),
        out_dir=d.dir(name), study_name=name, n_trials=3, objectives=["output_throughput"],
        target_concurrency=1, constraints={}), say=lambda _m: None)
    trials = study.get_trials(deepcopy=False)
    launched = sorted(int(p.parent.name) for p in (d.out / name / "trials").glob("*/engine.log"))
    keys = [trials[n].user_attrs.get("key") for n in launched]
    copies = [t for t in trials if "duplicate_of" in t.user_attrs]
    told = all(t.state == TrialState.FAIL and t.number not in launched
               and t.user_attrs["failure"]["kind"] == "engine_crashed"
               and t.user_attrs["failure"]["reason"] == trials[t.user_attrs["duplicate_of"]]
               .user_attrs["failure"]["reason"] for t in copies)
    ok = bool(copies) and told and len(keys) == len(set(keys)) == 3
    said = ", ".join(f"{t.number}->{t.user_attrs['duplicate_of']}" for t in copies)
    return Outcome(f"{len(launched)} launches for {len(set(keys))} configs; re-proposals "
                   f"answered from storage as FAIL (trial->original: {said or 'none!'})", ok,
                   _study_lost(study, 3))


def every_trial_failed(d: Drill, real: bool) -> Outcome:
    name = "all-failed"
    out = d.out / name
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 1, "startup_s": 0,
                         "crash_on_start": "ValueError: no such model"})
    cmd = [sys.executable, "-m", "tuner", "optimize", "--model", str(EMBEDDED_TOKENIZER),
           "--vllm-cmd", f"{sys.executable} -m tuner.testing.fake_engine",
           f"--engine-args=--fake-script '{script}'", "--engine-env", f"{MARK}={RUN}:{name}",
           "--space", "ngram", "--n-trials", "3", "--num-prompts", "2", "--output-len", "8",
           "--concurrency", "1", "--output-dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": PYTHONPATH})
    last = (r.stderr.strip().splitlines() or [""])[-1]
    report = (out / "report.html").exists()
    ok = (r.returncode == 1 and report and "Traceback" not in r.stderr
          and last.startswith("tuner: error: All 3 trials failed; most common: "
                              "engine_crashed x3: vLLM exited with status 1")
          and "Logs: " in last)
    m = re.search(r"(All \d+ trials failed; most common: \w+ x\d+)", last)
    return Outcome(f"exit {r.returncode}, one line: '{m[1] if m else _short(last, 60)}: "
                   f"...'; report.html {'written' if report else 'MISSING'}", ok,
                   _study_lost(st.open_existing(out), 3))


def _tuner(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": PYTHONPATH},
                          **kw)


def _values(out: Path) -> dict[int, list[float]]:
    from optuna.trial import TrialState

    return {t.number: t.values for t in st.open_existing(out).get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,))}


def _changed(before: dict[int, list[float]], out: Path) -> int:
    after = _values(out)
    return sum(1 for n, v in before.items() if after.get(n) != v)


def torn_journal_tail(d: Drill, real: bool) -> Outcome:
    from tuner.search import storage

    name = "torn-journal"
    out = d.dir(name)
    assert _tuner(*_driver_cmd(out, name, 2)[3:]).returncode == 0
    journal = out / storage.JOURNAL
    os.truncate(journal, journal.stat().st_size - 40)  # `truncate -s -40 study.journal`
    before = _values(out)
    r = _tuner(*_driver_cmd(out, name, 3)[3:])
    said = [ln for ln in r.stderr.splitlines() if "the last line was torn" in ln]
    sides = list(out.glob("study.journal.torn-*"))
    found = storage.scan(journal)
    ok = (r.returncode == 0 and len(said) == 1 and len(sides) == 1 and sides[0].name in said[0]
          and not found.bad and not found.tail)
    m = re.search(r"torn \((\d+ bytes)[^;]*; moved it to (\S+) .*All (\d+) complete", "".join(said))
    seen = f"{m[1]} moved to {m[2]}, {m[3]} records kept" if m else "no torn-tail line!"
    return Outcome(f"resume exit {r.returncode}: 1 line, {seen}; {len(before)} completed trials "
                   f"intact, appends clean", ok, _changed(before, out)
                   + _study_lost(st.open_existing(out), 3))


def garbage_middle_line(d: Drill, real: bool) -> Outcome:
    name = "garbage-line"
    out = d.dir(name)
    assert _tuner(*_driver_cmd(out, name, 2)[3:]).returncode == 0
    before = _values(out)
    journal = out / "study.journal"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:6] + [b"\x00\xff garbage \x81\n"] + lines[6:]))
    refused = _tuner("report", str(out))
    fixed = _tuner("repair", str(out))
    again = _tuner("report", str(out))
    quarantine = list(out.glob("study.journal.quarantine-*"))
    ok = (refused.returncode == 2 and "line 7 of" in refused.stderr
          and f"tuner repair {out}" in refused.stderr and "Traceback" not in refused.stderr
          and fixed.returncode == 0 and len(quarantine) == 1
          and quarantine[0].read_bytes() == b"\x00\xff garbage \x81\n" and again.returncode == 0
          and journal.read_bytes() == b"".join(lines))
    m = re.search(r"moved (\d+) bad line\S* to \S+ beside it and kept (\d+) records", fixed.stdout)
    return Outcome(f"report exit {refused.returncode} naming line 7 + `tuner repair`; repair "
                   f"exit {fixed.returncode}: {f'{m[1]} line quarantined, {m[2]} kept' if m else '?'}"
                   f"; report exit {again.returncode}", ok, _changed(before, out))


def two_drivers(d: Drill, real: bool) -> Outcome:
    from tuner.search import storage

    name = "two-drivers"
    out = d.dir(name)
    first = subprocess.Popen(_driver_cmd(out, name, 3), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": PYTHONPATH})
    try:
        holder = None
        deadline = time.monotonic() + 60
        while holder is None and time.monotonic() < deadline:
            try:
                holder = json.loads((out / storage.LOCK).read_text())["pid"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
        second = _tuner(*_driver_cmd(out, name, 3)[3:])
        policy = _tuner("policy", str(out))
        first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    study = st.open_existing(out)
    died = [t.number for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("failure", {}).get("kind") == "driver_died"]
    named = f"in use by tuner pid {first.pid} on host"
    ok = (holder == first.pid and second.returncode == 2 and named in second.stderr
          and policy.returncode == 2 and named in policy.stderr and first.returncode == 0
          and not died and "Traceback" not in second.stderr + policy.stderr)
    return Outcome(f"2nd optimize exit {second.returncode}, policy exit {policy.returncode}, both "
                   f"{'naming' if named in second.stderr else 'NOT naming'} pid {first.pid}; 1st "
                   f"exit {first.returncode}, {len(died)} trials marked dead", ok,
                   len(died) + _study_lost(study, 3))


def disk_full(d: Drill, real: bool) -> Outcome:
    from tuner.search import storage

    name = "disk-full"
    mnt = d.dir(name)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True).returncode == 0
    out = mnt / "study"
    how = "64 KiB tmpfs"
    try:
        out.mkdir()
        if mounted:
            # Trial folders on the big disk: the journal is what fills the small one.
            (out / "trials").symlink_to(d.dir(f"{name}-trials"))
            (mnt / "filler").write_bytes(b"\0" * 40_000)
            r = _tuner(*_driver_cmd(out, name, 12)[3:])
        else:  # not root: the journal's appends fail with ENOSPC after 40 records
            how = "ENOSPC injected (not root)"
            inject = ("import errno, sys\nfrom optuna.storages.journal import JournalFileBackend "
                      "as B\nreal, n = B.append_logs, [0]\ndef full(self, logs):\n    n[0] += 1\n"
                      "    if n[0] > 40:\n        raise OSError(errno.ENOSPC, 'No space left on "
                      "device')\n    real(self, logs)\nB.append_logs = full\nfrom tuner import cli"
                      "\nsys.exit(cli.main(sys.argv[1:]))\n")
            r = subprocess.run([sys.executable, "-c", inject, *_driver_cmd(out, name, 12)[3:]],
                               capture_output=True, text=True, timeout=300, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": PYTHONPATH})
        last = (r.stderr.strip().splitlines() or [""])[-1]
        before = _values(out)
        (mnt / "filler").unlink(missing_ok=True)
        n = st.counted_trials(st.open_existing(out)) + 1
        resumed = _tuner(*_driver_cmd(out, name, n)[3:])
        torn = list(out.glob("study.journal.torn-*"))
        ok = (r.returncode == 2 and "Traceback" not in r.stderr and bool(before)
              and last.startswith(f"tuner: error: No space left on device writing "
                                  f"{out / storage.JOURNAL}.")
              and "the same command resumes" in last and resumed.returncode == 0
              and (not torn or "the last line was torn" in resumed.stderr))
        lost = _changed(before, out) + _study_lost(st.open_existing(out), n)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
    return Outcome(f"{how}: exit {r.returncode}, 1 line naming study.journal after "
                   f"{len(before)} trials; freed, resume exit {resumed.returncode}"
                   f"{', torn tail quarantined' if torn else ''}", ok, lost)


def _bench_driver(d: Drill, fault: str, real: bool, **script) -> tuple[subprocess.Popen, Path]:
    """`tuner bench` as a user runs it, in its own session, every process it starts marked."""
    out = d.dir(fault)
    cmd = [sys.executable, "-m", "tuner", "bench", "--num-prompts", "2", "--output-len", "48",
           "--concurrency", "1", "--output-dir", str(out)]
    if not real:
        script = {"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0, "child_process": True, **script}
        cmd += ["--model", str(EMBEDDED_TOKENIZER), "--vllm-cmd",
                f"{sys.executable} -m tuner.testing.fake_engine",
                f"--engine-args=--fake-script '{json.dumps(script)}'"]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, MARK: f"{RUN}:{fault}"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env, cwd=ROOT)
    return proc, out / "engine.log"


def _engine_processes(fault: str, log: Path) -> list[str]:
    """This fault's watchdog, engine and the engine's children: marked processes other than
    the driver, and every live process of the engine's session. vLLM renames EngineCore and
    its workers with setproctitle, which overwrites /proc/PID/environ: no marker is seen there."""
    found = [p for p in marked_processes(f"{RUN}:{fault}") if " -m tuner bench " not in p]
    sid = (engine_of(log) or (None,))[0]
    if sid is not None:
        found += [p for p in leaks.session_members(sid) if p.split(":")[0] + ":" not in str(found)]
    return found


def driver_sigkill_engine_tree(d: Drill, real: bool) -> Outcome:
    fault = "driver-kill9-tree"
    proc, log = _bench_driver(d, fault, real)
    try:
        if not wait_for(log, "Application startup complete", timeout_s=900 if real else 120):
            return Outcome("the engine never started", False)
        # Mid-trial: vLLM logs each request it serves; the fake serves its first at once.
        if not real or wait_for(log, "POST /v1/", timeout_s=120):
            time.sleep(0.5)
        engine = _engine_processes(fault, log)
        cores = [p for p in engine if "VLLM::EngineCore" in p]
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        core_s = None
        while time.monotonic() - t0 < 30:
            left = _engine_processes(fault, log)
            if core_s is None and not any(p in left for p in cores):
                core_s = time.monotonic() - t0
            if not left:
                break
            time.sleep(0.02)
        all_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    pid_port = engine_of(log)
    what = (f"VLLM::EngineCore gone {core_s:.2f} s after kill -9, " if real and cores else "")
    ok = (proc.returncode == -signal.SIGKILL and len(engine) >= 3 and (not real or bool(cores))
          and all_s < 10 and (core_s or 99) < 10
          and "its driver is gone" in log.read_text(errors="replace"))
    return Outcome(f"exit {proc.returncode} with {len(engine)} engine processes (watchdog "
                   f"included) running; {what}all gone in {all_s:.2f} s (watchdog: pipe EOF)",
                   ok, 0, pgids=[pid_port[0]] if pid_port else [],
                   ports=[pid_port[1]] if pid_port else [])


def double_ctrl_c(d: Drill, real: bool) -> Outcome:
    fault = "double-ctrl-c"
    # The fake ignores SIGTERM, so teardown waits out its grace; vLLM stops in about a second,
    # so the second Ctrl-C follows the first as soon as vLLM logs that its shutdown began.
    proc, log = _bench_driver(d, fault, real, ignore_sigterm=True)
    try:
        if not wait_for(log, "Application startup complete", timeout_s=900 if real else 120):
            return Outcome("the engine never started", False)
        if not real or wait_for(log, "POST /v1/", timeout_s=120):
            time.sleep(0.5)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        if real:
            deadline = t0 + 10
            while time.monotonic() < deadline and "[shutdown]" not in log.read_text(
                    errors="replace").split("Application startup complete", 1)[-1]:
                time.sleep(0.002)
        else:
            time.sleep(1.5)
        alive = len(_engine_processes(fault, log))
        gap_s = time.monotonic() - t0
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=TEARDOWN_GRACE_S + 60)
        took_s = time.monotonic() - t0
        left_at_exit = _engine_processes(fault, log)  # no grace: gone when the message said so
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    one_line = bool(lines) and lines[-1] == INTERRUPTED
    by_watchdog = "its driver is gone" in log.read_text(errors="replace")
    ok = (proc.returncode == 130 and one_line and "Traceback" not in err and alive > 0
          and not left_at_exit and not by_watchdog)
    pid_port = engine_of(log)
    return Outcome(f"2nd Ctrl-C {gap_s:.2f} s after the 1st, {alive} engine processes still "
                   f"running; exit {proc.returncode} after {took_s:.1f} s, "
                   f"{'the 1-line message' if one_line else 'NOT the message'}, "
                   f"{len(left_at_exit)} left at exit"
                   f"{', TRACEBACK' if 'Traceback' in err else ''}"
                   f"{', stopped only by the watchdog' if by_watchdog else ''}", ok, 0,
                   pgids=[pid_port[0]] if pid_port else [],
                   ports=[pid_port[1]] if pid_port else [])


def _study_state(out: Path) -> dict[int, tuple]:
    return {t.number: (t.state.name, t.values, t.params)
            for t in st.open_existing(out).get_trials(deepcopy=False)}


def _tmpfs(path: Path, options: str, mounted: list[Path]) -> bool:
    """A small tmpfs at `path` (root only): a read-only or full disk made on demand."""
    path.mkdir(parents=True, exist_ok=True)
    ok = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True).returncode == 0
    if ok:
        mounted.append(path)
    return ok


BAD_INPUT_CASES = 18
_FULL_DISK = ("import errno, os, sys\ndef full(fd):\n    raise OSError(errno.ENOSPC, 'No space left "
              "on device')\nos.fsync = full\nfrom tuner import cli\nsys.exit(cli.main(sys.argv[1:]))"
              "\n")


def bad_inputs(d: Drill, real: bool) -> Outcome:
    """Each input tuner.checks refuses, typed against an existing study as a user would: exit
    2, one line, no traceback, no engine started, and the study's trials exactly as they were."""
    name = "bad-inputs"
    out = d.dir(name)
    made = _tuner(*_driver_cmd(out, name, 2)[3:])
    if made.returncode != 0:
        return Outcome(f"the study was not made: exit {made.returncode}: "
                       f"{_short(made.stderr[-300:])}", False, 1)
    before, trial_dirs = _study_state(out), sorted(os.listdir(out / "trials"))
    work = d.dir(f"{name}-files")
    (work / "nan.yaml").write_text("methods:\n  ngram:\n    num_speculative_tokens: .nan\n")
    (work / "huge.yaml").write_text("methods:\n  ngram:\n    num_speculative_tokens: 3\n"
                                    "    prompt_lookup_max: 1e300\n")
    (work / "long.jsonl").write_text(json.dumps({"prompt": "x " * (9 << 20)}) + "\n")
    (work / "file").write_text("x")
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0})
    custom = ["--workload", "custom", "--dataset-path"]
    cases: list[tuple[str, list[str], str]] = [
        ("timeout nan", ["--request-timeout", "nan"], "--request-timeout nan: must be a finite"),
        ("timeout 0", ["--request-timeout", "0"], "between 0.1 and 86400"),
        ("timeout < 0", ["--level-timeout=-5"], "--level-timeout -5: must be"),
        ("temperature inf", ["--temperature", "inf"], "between 0 and 2"),
        ("n-trials 1e300", ["--n-trials", "1e300"], "--n-trials 1e300: must be a whole number"),
        ("TPOT SLO < 0", ["--max-tpot-ms=-1"], "--max-tpot-ms -1: must be"),
        ("concurrency 100000", ["--concurrency", "100000"], "from 1 to 4096"),
        ("c > max-num-seqs", ["--concurrency", "8",
                              f"--engine-args=--fake-script '{script}' --max-num-seqs 4"],
         "--concurrency 8: above the engine's --max-num-seqs 4"),
        ("YAML .nan", ["--space", str(work / "nan.yaml")], "num_speculative_tokens: nan: must"),
        ("YAML 1e300", ["--space", str(work / "huge.yaml")], "prompt_lookup_max: 1e300: must"),
        ("/dev/zero", [*custom, "/dev/zero"], "is a device"),
        ("a directory", [*custom, str(work)], "is a directory"),
        ("18 MiB line", [*custom, str(work / "long.jsonl")], "line 1 is longer than 16 MiB"),
        ("beyond context", [f"--engine-args=--fake-script '{script}' --max-model-len 32"],
         "none of its prompts fits the model's context of 32 tokens"),
        ("out: a file", ["--output-dir", str(work / "file")], "is a file, not a folder"),
        ("out: under a file", ["--output-dir", str(work / "file" / "x")],
         "cannot create the folder"),
    ]
    mounted: list[Path] = []
    try:
        ro = work / "read-only"
        if not _tmpfs(ro, "ro,size=64k", mounted):
            if os.geteuid() == 0:
                ro = Path("/sys")  # sysfs refuses a new file even to root
            else:
                ro.chmod(0o555)
        cases.append(("out: read-only", ["--output-dir", str(ro)], "cannot write in it"))
        full = work / "full"
        if _tmpfs(full, "size=64k", mounted):
            with contextlib.suppress(OSError), open(full / "filler", "wb") as f:
                f.write(b"\0" * (128 << 10))
            cases.append(("out: full disk", ["--output-dir", str(full / "study")],
                          "No space left on device"))
        else:  # not root: the probe's fsync fails as on a full disk
            cases.append(("out: full disk (injected)", ["--output-dir", str(full)],
                          "No space left on device"))
        assert len(cases) == BAD_INPUT_CASES
        failed = []
        for label, extra, fragment in cases:
            args = ["-q", *_driver_cmd(out, name, 2)[3:], *extra]
            r = (subprocess.run([sys.executable, "-c", _FULL_DISK, *args], capture_output=True,
                                text=True, timeout=300, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": PYTHONPATH})
                 if label.endswith("(injected)") else _tuner(*args))
            lines = r.stderr.strip().splitlines()
            if not (r.returncode == 2 and len(lines) == 1 and lines[0].startswith(
                    "tuner: error: ") and fragment in lines[0] and "Traceback" not in r.stderr):
                failed.append(f"{label}: exit {r.returncode}, {len(lines)} lines: "
                              f"{_short(r.stderr.strip(), 120)}")
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)
    after = _study_state(out)
    changed = sum(1 for n, v in before.items() if after.get(n) != v) + len(set(after) - set(before))
    started = sorted(os.listdir(out / "trials")) != trial_dirs or bool(marked_processes(
        f"{RUN}:{name}"))
    ok = not failed and not changed and not started and (work / "file").read_text() == "x"
    for f in failed:
        print(f"fault_drill:   bad input {f}", file=sys.stderr)
    return Outcome(f"{len(cases) - len(failed)}/{len(cases)} exit 2, 1 line, no traceback"
                   f"{' (' + '; '.join(f.split(':')[0] for f in failed) + ' FAILED)' if failed else ''}"
                   f"; study: {len(before)} trials {'CHANGED' if changed else 'intact'}, "
                   f"{'an engine started!' if started else 'no engine started'}", ok,
                   changed + _study_lost(st.open_existing(out), 2))


def faults(real_engine: bool) -> list[Fault]:
    engine = "real" if real_engine else "fake"
    return [
        ("exits at start-up (min>max window)", engine, "EngineCrashed, vLLM's reason",
         crash_at_start),
        ("SIGKILL mid-measurement", engine, "EngineDied -> FAIL trial", killed_mid_measurement),
        ("hangs before /health (SIGSTOP)" if real_engine else "hangs before /health", engine,
         "EngineStartTimeout, reaped", hang_before_health),
        ("/health ok, requests stall", "fake", "timeouts -> MeasurementFailed",
         stalled_requests),
        ("malformed + HTTP 500, 13%", "fake", "errors counted, trial kept", errors_below_limit),
        ("malformed + HTTP 500, >20%", "fake", "MeasurementFailed -> FAIL", errors_above_limit),
        ("port taken before bind", "fake", "retry on another port", port_taken),
        ("driver SIGINT mid-trial", "fake", "exit 130, 1 line, resume",
         lambda d, _: driver_signal(d, signal.SIGINT)),
        ("driver SIGKILL mid-trial", "fake", "engine dies too, resume",
         lambda d, _: driver_signal(d, signal.SIGKILL)),
        ("Ray worker killed mid-trial", "fake", "FAIL worker_died, goes on", ray_worker_dies),
        ("rejected config proposed again", "fake", "launched once, FAIL from storage",
         rejected_proposed_again),
        ("every trial failed", "fake", "exit 1, most common reason", every_trial_failed),
        ("torn journal tail (truncate -40)", "fake", "tail quarantined, 1 line, resume",
         torn_journal_tail),
        ("garbage line mid-journal", "fake", "exit 2 + line no.; repair", garbage_middle_line),
        ("two drivers on one study", "fake", "2nd exits 2 naming holder", two_drivers),
        ("disk full during a study", "fake", "exit 2, 1 line; resume", disk_full),
        ("driver SIGKILL, real engine" if real_engine else "driver SIGKILL, engine tree",
         engine, "watchdog kills tree < 10 s", driver_sigkill_engine_tree),
        ("double Ctrl-C, real engine" if real_engine else "double Ctrl-C, slow engine", engine,
         "teardown completes, exit 130", double_ctrl_c),
        (f"bad inputs ({BAD_INPUT_CASES} cases)", "fake", "exit 2, 1 line, study intact",
         bad_inputs),
    ]


def run_fault(d: Drill, name: str, engine: str, expected: str, fn) -> Row:
    t0 = time.monotonic()
    try:
        outcome = fn(d, engine == "real")
    except Exception as e:  # a fault that escapes as an exception is itself a finding
        import traceback

        traceback.print_exc()
        outcome = Outcome(f"escaped: {type(e).__name__}: {_short(str(e), 80)}", False, lost=1)
    left = leftovers(outcome.pgids, outcome.ports)
    ok = outcome.ok and outcome.lost == 0 and not left
    return Row(name, engine, expected, outcome.observed, outcome.lost, len(left), ok,
               time.monotonic() - t0, left)


def table(rows: list[Row]) -> str:
    head = ["fault", "engine", "expected", "observed", "lost", "leftover", "result", "time"]
    width = [max(len(head[0]), *(len(r.fault) for r in rows)), 6,
             max(len(head[2]), *(len(r.expected) for r in rows)), 60, 4, 8, 6, 6]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, width, strict=True)),
             "  ".join("-" * w for w in width)]
    for r in rows:
        observed = textwrap.wrap(r.observed, width[3]) or [""]
        cells = [r.fault, r.engine, r.expected, observed[0], str(r.lost), str(r.leftover),
                 "PASS" if r.ok else "FAIL", f"{r.seconds:.0f} s"]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, width, strict=True)).rstrip())
        pad = " " * (sum(width[:3]) + 6)
        lines += [pad + more for more in observed[1:]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fake-only", action="store_true",
                   help="skip the real vLLM engine: the fake engine stands in for every fault")
    p.add_argument("--keep", type=Path, help="keep trial folders and logs in this folder")
    p.add_argument("--only", metavar="NAME,...",
                   help="run only the faults whose name contains one of these (any case), "
                   "e.g. --only 'journal,two drivers'")
    args = p.parse_args(argv)
    if not args.fake_only:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            print("fault_drill: vLLM is not importable here, so the real-engine faults cannot "
                  "run. Install the `cpu` extra (scripts/setup.sh), or pass --fake-only.",
                  file=sys.stderr)
            return 2
    from tuner.search.study import quiet_optuna

    quiet_optuna()
    out = args.keep or Path(tempfile.mkdtemp(prefix="fault-drill-"))
    out.mkdir(parents=True, exist_ok=True)
    d = Drill(out)
    rows = []
    t0 = time.monotonic()
    chosen = faults(real_engine=not args.fake_only)
    if args.only:
        wanted = [w.strip().lower() for w in args.only.split(",") if w.strip()]
        chosen = [f for f in chosen if any(w in f[0].lower() for w in wanted)]
        if not chosen:
            print(f"fault_drill: --only '{args.only}' matches no fault. Faults: "
                  f"{'; '.join(f[0] for f in faults(real_engine=not args.fake_only))}.",
                  file=sys.stderr)
            return 2
    for name, engine, expected, fn in chosen:
        print(f"fault_drill: {name} [{engine}] ...", file=sys.stderr, flush=True)
        row = run_fault(d, name, engine, expected, fn)
        print(f"fault_drill:   {'PASS' if row.ok else 'FAIL'} in {row.seconds:.0f} s: "
              f"{row.observed}", file=sys.stderr, flush=True)
        rows.append(row)
    print(table(rows))
    failed = [r for r in rows if not r.ok]
    for r in failed:
        print(f"\nFAIL {r.fault} [{r.engine}]: {r.observed}; lost {r.lost}; leftovers: "
              f"{r.leftovers or 'none'}")
    print(f"\n{len(rows) - len(failed)}/{len(rows)} faults passed in "
          f"{time.monotonic() - t0:.0f} s (logs: {out}).")
    if not failed and not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
