"""Engine stage: the lifecycle of one `vllm serve` process for one trial.

Promises: the server runs in its own process group, listens on a free loopback port with a
random per-trial API key, writes everything to the trial's engine.log, is declared ready only
when /health answers 200 (a crash and a timeout are told apart), and is always reaped: SIGTERM
to the whole group, SIGKILL after a grace period, on normal exit, exceptions and Ctrl-C (a
second Ctrl-C waits until the reaping is done). Whatever kills the driver instead, the
engine's watchdog (tuner/measure/watchdog.py) stops the engine's whole process tree.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuner import commands
from tuner.errors import EngineCrashed, EngineStartTimeout
from tuner.measure import watchdog
from tuner.records import EngineInfo, EngineSpec, TrialConfig

TEARDOWN_GRACE_S = 15.0
# Once the driver is dead nobody waits for a graceful exit: a short grace lets vLLM free its
# memory itself and keeps the whole teardown well under 10 s.
ORPHAN_GRACE_S = 3.0
LOG_TAIL_LINES = 30
# Lines in engine.log that say which engine path a trial took (issue: a fair baseline needs it).
_ENGINE_PATH_PATTERNS = {
    "vllm_version": re.compile(r"(?:vLLM API server version |LLM engine \(v)([\w.+-]+)"),
    "model_runner": re.compile(r"using the (V\d) model runner|(V\d) [Mm]odel [Rr]unner is (?:used|enabled)"
                               r"|Using (V\d) [Mm]odel [Rr]unner"),
    "async_scheduling": re.compile(r"async_scheduling=(\w+)|Async scheduling (?:is|will be) "
                                   r"(disabled|enabled)"),
    "enforce_eager": re.compile(r"enforce_eager=(\w+)"),
    "cudagraph_mode": re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)"),
    "attention_backend": re.compile(r"Using (\w+) (?:attention )?backend"),
    "dtype": re.compile(r"dtype=torch\.(\w+)"),
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_ROOT_CAUSE = re.compile(r"(OutOfMemoryError|CUDA out of memory|Free memory on device|"
                         r"ValueError: |ModuleNotFoundError|ImportError|NotImplementedError|"
                         r"AssertionError|address already in use)", re.I)


def root_cause(log_path: Path) -> str | None:
    """vLLM's engine core dies first and the API server then reports only "Engine core
    initialization failed. See root cause above": find that root cause in the whole log."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if _ROOT_CAUSE.search(line) and "Traceback" not in line:
            return line.strip()[-400:]
    return None


def vllm_reason(tail: str) -> str:
    """The most telling line of a failed start: vLLM's own validation error when present."""
    lines = tail.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if re.search(r"(Error|Exception|error:)", line) and "Traceback" not in line:
            reason = line.strip()
            # vLLM's configs are pydantic dataclasses: a rejected value reads "ValidationError:
            # 1 validation error for SpeculativeConfig" with the actual message on the next line.
            if "validation error for" in line and i + 1 < len(lines):
                reason += ": " + re.sub(r"\s*\[type=.*$", "", lines[i + 1].strip())
            return reason[-400:]
    return lines[-1].strip()[-400:] if tail.strip() else "no output in engine.log"


class Engine:
    """A running vLLM server. Use as a context manager: `with Engine(...) as eng: eng.url`."""

    def __init__(self, spec: EngineSpec, config: TrialConfig, *, log_path: Path) -> None:
        self.spec = spec
        self.config = config
        self.log_path = log_path
        self.api_key = "tuner-" + secrets.token_hex(16)
        self.port = 0
        self.proc: watchdog.Watched | None = None
        self.info: EngineInfo | None = None

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    def __enter__(self) -> Engine:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EngineInfo:
        """Launch and wait for /health; retries once on a port taken between probe and bind."""
        for attempt in range(3):
            try:
                return self._start_once()
            except EngineCrashed as e:
                if "address already in use" not in e.log_tail.lower() or attempt == 2:
                    raise
                self.stop()
        raise AssertionError("unreachable")

    def _start_once(self) -> EngineInfo:
        self.port = free_port(self.spec.host)
        argv = commands.engine_argv(self.spec, self.config, port=self.port,
                                     api_key=self.api_key)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env, **self.config.engine_env}
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"# tuner: {' '.join(argv[:1] + ['...'] + argv[-2:])}\n".encode())
            log.flush()
            # The engine runs in its own session under a watchdog; self.proc's pid, poll() and
            # exit status are still the engine's own, as the watchdog reports them.
            self.proc = watchdog.spawn(argv, env=env, log=log, grace_s=ORPHAN_GRACE_S)
        _STARTED[self.proc.pid] = self.proc
        deadline = t0 + self.spec.ready_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                elapsed = time.monotonic() - t0
                tail = log_tail(self.log_path)
                reason = vllm_reason(tail)
                if "root cause" in reason.lower() or "initialization failed" in reason.lower():
                    reason = root_cause(self.log_path) or reason
                raise EngineCrashed(
                    f"vLLM exited with status {code} after {elapsed:.0f} s, before /health "
                    f"answered: {reason}", log_tail=tail)
            if self._healthy():
                break
            if time.monotonic() > deadline:
                tail = log_tail(self.log_path)
                raise EngineStartTimeout(
                    f"vLLM did not answer /health within {self.spec.ready_timeout_s:.0f} s "
                    f"(process still alive; raise --ready-timeout if start-up is just slow)",
                    log_tail=tail)
            time.sleep(0.25)
        self.info = EngineInfo(start_s=round(time.monotonic() - t0, 2), **_engine_details(self.log_path))
        return self.info

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period; idempotent. Ctrl-C
        and SIGTERM wait until it is done: an interrupted teardown left the engine running."""
        with _signals_deferred():
            proc, self.proc = self.proc, None
            if proc is None:
                return
            reap_group(proc, grace_s=TEARDOWN_GRACE_S)
            # The watchdog exits once the tree is gone; a tree left alive it keeps killing.
            if proc.close(timeout_s=5.0) and not proc.tree_alive():
                _STARTED.pop(proc.pid, None)


# Every engine this process started whose tree may still run, by the engine's pid.
_STARTED: dict[int, watchdog.Watched] = {}


def live_engines() -> list[int]:
    """Pids (= process groups) of the engines this process started that are not gone: a
    process of the group or the engine's watchdog still runs. Checked, not remembered."""
    for pid, proc in list(_STARTED.items()):
        if not proc.tree_alive():
            _STARTED.pop(pid, None)
    return sorted(_STARTED)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block is done, then deliver them: a second Ctrl-C
    while an engine is slow to stop must not cancel the SIGTERM -> SIGKILL sequence. Python
    runs signal handlers in the main thread only, so elsewhere there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, _frame: held.append(signum))
           for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)  # the usual handler now: KeyboardInterrupt in the CLI


def reap_group(proc: watchdog.Watched | subprocess.Popen, *, grace_s: float) -> None:
    """Terminate a process started in its own session and everything in its group."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
            if sig == signal.SIGTERM:
                # A stopped process (SIGSTOP, a debugger) keeps SIGTERM pending until it runs
                # again; without SIGCONT the whole grace period passes for nothing.
                os.killpg(pgid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; children in the group (vLLM's engine core) may linger.
        if not _group_alive(pgid):
            return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    # SIGKILL is asynchronous: a killed process still runs its exit (freeing GiBs of KV cache,
    # or GPU memory) and an orphan stays in the group as a zombie until init reaps it. Return
    # only once the group is empty, so the next trial never starts beside this one's remains.
    deadline = time.monotonic() + 10.0
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _engine_details(log_path: Path) -> dict:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    details: dict[str, str] = {}
    version = None
    for name, pattern in _ENGINE_PATH_PATTERNS.items():
        m = pattern.search(text)
        if m:
            value = next((g for g in m.groups() if g), "")[:200]
            if name == "vllm_version":
                version = value
            else:
                details[name] = value
    return {"vllm_version": version, "details": details}
