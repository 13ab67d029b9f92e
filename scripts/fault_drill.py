"""Fault drill: inject every fault the tuner must survive and prove that nothing is lost.

Faults about the engine run on the real vLLM CPU engine with the embedded model; the others
(and, with --fake-only, all of them) on the scripted fake engine (tuner/fake_engine.py). After
each fault the drill checks three things: the expected outcome was recorded as data (a FAIL
trial with its reason, or errored records counted); no trial was lost (every trial that ran
is in storage, and a resumed study kept every completed trial); and nothing was left behind:
no live process carrying this drill's marker in its environment (every engine the drill starts
carries it: tuner.fake_engine, vllm.entrypoints and vLLM's renamed VLLM::EngineCore children),
none in the engine's process group, and nothing listening on the engine's port.

    python scripts/fault_drill.py              # real-engine faults included (several minutes)
    python scripts/fault_drill.py --fake-only  # the fake engine stands in for vLLM (2-3 min)

Prints one row per fault; exit status 1 if any fault fails.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner import api, runner  # noqa: E402
from tuner import study as st  # noqa: E402
from tuner.engine import TEARDOWN_GRACE_S  # noqa: E402
from tuner.fake_engine import SCRIPT_ENV  # noqa: E402
from tuner.records import (EngineSpec, MeasureSettings, Prompt, TrialConfig,  # noqa: E402
                           Workload, WorkloadSpec)
from tuner.workloads import EMBEDDED_TOKENIZER  # noqa: E402

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


# --- processes, groups, ports ------------------------------------------------------------------
def marked_processes(value_prefix: str = RUN) -> list[str]:
    """Live processes whose environment has MARK=<value starting with value_prefix>."""
    found = []
    needle = f"{MARK}={value_prefix}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if not any(item.startswith(needle) for item in env):
                continue
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] not in "ZX":
            found.append(f"pid {pid}: {cmd.strip()[:100]}")
    return found


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(pid))
    return out


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def leftovers(pgids: list[int], ports: list[int], *, wait_s: float = 10.0) -> list[str]:
    """What survived; a dead parent's engine dies by PR_SET_PDEATHSIG a moment later, so poll."""
    deadline = time.monotonic() + wait_s
    while True:
        left = marked_processes()
        left += [f"pid {p} in engine group {g}" for g in pgids for p in group_members(g)
                 if f"pid {p}:" not in " ".join(left)]
        left += [f"port {p} still accepts connections" for p in ports if listening(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def engine_of(log: Path) -> tuple[int, int] | None:
    """(pid, port) of the last engine that wrote `log`: uvicorn's and vLLM's own lines."""
    text = log.read_text(errors="replace") if log.exists() else ""
    pids = re.findall(r"Started server process \[(\d+)\]", text)
    ports = re.findall(r"Starting vLLM server on http://[\d.]+:(\d+)", text)
    return (int(pids[-1]), int(ports[-1])) if pids and ports else None


def wait_for(path: Path, text: str, *, timeout_s: float, after: str | None = None,
             stop: threading.Event | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        body = path.read_text(errors="replace") if path.exists() else ""
        if after is not None:
            body = body.split(after, 1)[1] if after in body else ""
        if text in body:
            return True
        time.sleep(0.1)
    return False


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
            "vllm_cmd": (sys.executable, "-m", "tuner.fake_engine"),
            "ready_timeout_s": 15.0, "request_timeout_s": 10.0, "level_timeout_s": 60.0,
            "tokenizer": str(EMBEDDED_TOKENIZER), **spec_fields,
            "env": {SCRIPT_ENV: json.dumps(script), "PYTHONPATH": PYTHONPATH,
                    MARK: f"{RUN}:{fault}"}})

    @staticmethod
    def real(fault: str, **spec_fields) -> EngineSpec:
        spec = api.resolve_engine(model=None, ready_timeout_s=900.0, request_timeout_s=120.0,
                                  env={MARK: f"{RUN}:{fault}"})
        return spec.model_copy(update=spec_fields)

    @staticmethod
    def fake_workload(n: int = 3, output_len: int = 12) -> Workload:
        prompts = tuple(Prompt(prompt=f"p{i} a b c", prompt_len=5, output_len=output_len)
                        for i in range(n))
        return Workload(spec=WorkloadSpec(name="random", num_prompts=n), prompts=prompts)

    def real_workload(self, spec: EngineSpec) -> Workload:
        if self._real_workload is None:
            from tuner import workloads

            self._real_workload = workloads.load(
                WorkloadSpec(name="instructcoder", num_prompts=2, output_len=48),
                tokenizer=api.tokenizer_of(spec))
        return self._real_workload


def _recorded(outcome: dict) -> int:
    """Trials lost by one measure_outcome: 0 when it came back as a result or a failure."""
    return 0 if ("result" in outcome or "failure" in outcome) else 1


def _failure(outcome: dict) -> tuple[str, str]:
    f = outcome.get("failure") or {}
    return f.get("kind", "(no failure)"), f.get("reason", "")


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
        # on demand. The engine is a child of this process's main thread.
        needle = f"{MARK}={RUN}:hang".encode()
        children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
        while not done.is_set():
            for p in children.read_text().split():
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
    return api.optimize(
        workload=WorkloadSpec(name="instructcoder", num_prompts=2, output_len=kw.pop("out", 8)),
        engine=spec, space_name="ngram", settings=kw.pop("settings", MeasureSettings()),
        out_dir=d.dir(name), study_name=name, n_trials=n_trials,
        objectives=["output_throughput"], target_concurrency=1, constraints={},
        say=lambda _m: None, **kw)


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
    if "result" not in out:
        kind, reason = _failure(out)
        return Outcome(f"{kind}: {_short(reason)}", False, _recorded(out))
    (level,) = out["result"]["levels"]
    kinds = sorted({"malformed" if "malformed" in e else e.split(":")[0] for e in level["errors"]})
    return Outcome(f"trial measured; {level['failed']}/{level['num_requests']} errored records "
                   f"counted ({', '.join(kinds)})",
                   level["failed"] == 4 and level["completed"] == 26, _recorded(out))


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
    import tuner.engine

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real_free_port = tuner.engine.free_port
    handed = iter([taken])
    tuner.engine.free_port = lambda host="127.0.0.1": next(handed, None) or real_free_port(host)
    trial_dir = d.dir("port")
    try:
        out = runner.measure_outcome(d.fake("port"), TrialConfig(), d.fake_workload(n=2),
                                     MeasureSettings(), str(trial_dir))
    finally:
        tuner.engine.free_port = real_free_port
        holder.close()
    log = (trial_dir / "engine.log").read_text(errors="replace")
    pid_port = engine_of(trial_dir / "engine.log")
    port = pid_port[1] if pid_port else None
    ok = "result" in out and "address already in use" in log.lower() and port not in (None, taken)
    seen = "address already in use" if "address already in use" in log.lower() else "no bind error"
    return Outcome(f"port {taken} held: {seen}; retried, measured on port {port}", ok,
                   _recorded(out), ports=[port] if port else [])


def _driver_cmd(out: Path, fault: str, n_trials: int = 3) -> list[str]:
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0})
    return [sys.executable, "-m", "tuner", "optimize", "--model", str(EMBEDDED_TOKENIZER),
            "--vllm-cmd", f"{sys.executable} -m tuner.fake_engine",
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
        after = [ln for ln in output.split("[1] trial", 1)[-1].splitlines()[1:] if ln.strip()]
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
        worker = int(Path(f"/proc/{pid_port[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
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
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, width)),
             "  ".join("-" * w for w in width)]
    for r in rows:
        observed = textwrap.wrap(r.observed, width[3]) or [""]
        cells = [r.fault, r.engine, r.expected, observed[0], str(r.lost), str(r.leftover),
                 "PASS" if r.ok else "FAIL", f"{r.seconds:.0f} s"]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, width)).rstrip())
        pad = " " * (sum(width[:3]) + 6)
        lines += [pad + more for more in observed[1:]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fake-only", action="store_true",
                   help="skip the real vLLM engine: the fake engine stands in for every fault")
    p.add_argument("--keep", type=Path, help="keep trial folders and logs in this folder")
    args = p.parse_args(argv)
    if not args.fake_only:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            print("fault_drill: vLLM is not importable here, so the real-engine faults cannot "
                  "run. Install the `cpu` extra (scripts/setup.sh), or pass --fake-only.",
                  file=sys.stderr)
            return 2
    from tuner.study import quiet_optuna

    quiet_optuna()
    out = args.keep or Path(tempfile.mkdtemp(prefix="fault-drill-"))
    out.mkdir(parents=True, exist_ok=True)
    d = Drill(out)
    rows = []
    t0 = time.monotonic()
    for name, engine, expected, fn in faults(real_engine=not args.fake_only):
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
