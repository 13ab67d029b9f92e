"""Engine stage: start vLLM's server without paying its imports again for every trial; the
driver's side.

A launcher is one process per driver (and engine environment) that imports torch and vLLM's
server module once, and then forks one engine per request (tuner.measure.launcher_process, run
as `python -m tuner.measure.launcher_process`). Here is what the driver holds: `Launcher`, a
running launcher process, and its per-engine handle `Forked`, which stands in for
watchdog.Watched; `launcher_for` keeps this driver's launchers alive between trials.

Reaping follows the watchdog (tuner/measure/watchdog.py), for several engines: the launcher is
a child subreaper, learns of its driver's death from EOF on its stdin (a pipe whose only write
end the driver holds), and then stops every engine tree it started, SIGTERM then SIGKILL; when
an engine's leader exits, what is left of its group is killed.

Protocol, one JSON object per line. Driver -> launcher: {"launch": N, "argv", "env", "log",
"cleanup"} and {"reap": PID}. Launcher -> driver: {"ready": import_s} or {"refused": why} once,
then {"launch": N, "pid": PID} or {"launch": N, "error": [errno, strerror, filename]},
{"pid": PID, "exit": CODE} and {"reaped": PID, "ok": BOOL}.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from tuner.measure import watchdog

# The server modules a launcher may run, as `python -m MODULE` would (tuner.measure.engine's
# entry points): what it imports once, before any fork.
API_SERVER = "vllm.entrypoints.openai.api_server"
MODULES = (API_SERVER, "vllm.entrypoints.cli.main")
KEEP = 2  # launchers kept alive per driver (an aligned baseline's engines have their own env)
GROUP_GONE_S = 10.0  # after SIGKILL: a dying engine still frees its memory before it is gone


class Refused(Exception):
    """The launcher could not start (or died); the message says why, in one line."""


class Launcher:
    """A running launcher process, as its driver sees it."""

    def __init__(self, *, module: str, env: dict[str, str], log: IO[bytes]) -> None:
        self.module = module
        self.env = env
        self.handles: dict[int, Forked] = {}
        self.import_s: float | None = None  # None until it has imported vLLM
        self._launches: dict[int, dict] = {}
        self._next = 0
        self._buffer = b""
        self._eof = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.measure.launcher_process", "--module", module],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
            # As the watchdog: Ctrl-C at the terminal reaches the driver only (the pipe tells).
            start_new_session=True)

    def wait_ready(self, *, timeout_s: float) -> bool:
        """True once the launcher has imported vLLM; False if it is still importing after
        timeout_s (it goes on: the next engine finds it ready). Refused if it cannot."""
        if self.import_s is not None:
            return True
        report = self._until(lambda r: "ready" in r or "refused" in r, timeout_s=timeout_s)
        if report is not None and "ready" in report:
            self.import_s = float(report["ready"])
            return True
        if report is None and self.alive() and not self._eof:
            return False
        self.close(timeout_s=GROUP_GONE_S)
        raise Refused(report["refused"] if report else
                      f"the launcher exited with status {self.proc.poll()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def launch(self, argv: list[str], *, env: dict[str, str], log_path: Path,
               cleanup: tuple[str, ...] = ()) -> Forked:
        """Fork one engine running `argv` (sys.executable -m MODULE ...); returns once it
        exists. OSError where the log cannot be opened; Refused where the launcher is gone."""
        self._next += 1
        n = self._next
        self._send({"launch": n, "argv": argv, "env": env, "log": str(log_path),
                    "cleanup": list(cleanup)})
        report = self._until(lambda _r: n in self._launches, timeout_s=watchdog.START_TIMEOUT_S)
        report = self._launches.pop(n, None) or report
        if report is None or "pid" not in report:
            if report is not None and "error" in report:
                errno, strerror, filename = report["error"]
                raise OSError(errno, strerror, filename)
            raise Refused(f"the launcher did not fork the engine (launcher status "
                          f"{self.proc.poll()})")
        handle = Forked(self, report["pid"], argv)
        self.handles[handle.pid] = handle
        return handle

    def close(self, *, timeout_s: float) -> bool:
        """Drop the pipe (the launcher stops whatever engines are left, then exits) and reap
        it; False if it is still at work after timeout_s."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout_s if self.import_s is not None else 0.5)
        except subprocess.TimeoutExpired:
            if self.import_s is not None:
                return False
            # Still importing: it reads the pipe only afterwards, and has forked nothing.
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)
        return True

    def _send(self, message: dict) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            raise Refused(f"the launcher is gone (status {self.proc.poll()})") from None

    def _until(self, done, *, timeout_s: float) -> dict | None:
        """Read reports until one satisfies `done` (returned) or timeout_s pass (None)."""
        deadline = time.monotonic() + timeout_s
        while True:
            report = self.read(timeout_s=max(0.0, deadline - time.monotonic()))
            if report is not None and done(report):
                return report
            if report is None and time.monotonic() >= deadline:
                return None
            if report is not None and report.get("eof"):
                return None

    def read(self, *, timeout_s: float | None) -> dict | None:
        """Wait up to timeout_s for the next report and apply it to the engine it is about."""
        if self._eof:
            return {"eof": True}
        if b"\n" not in self._buffer:
            assert self.proc.stdout is not None
            fd = self.proc.stdout.fileno()
            if not select.select([fd], [], [], timeout_s)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                # Gone without a word: killed, and PR_SET_PDEATHSIG took its engines along.
                self._eof = True
                for handle in self.handles.values():
                    if handle.returncode is None:
                        handle.returncode = -signal.SIGKILL
                return {"eof": True}
            self._buffer += chunk
            if b"\n" not in self._buffer:
                return {}
        line, self._buffer = self._buffer.split(b"\n", 1)
        report = json.loads(line)
        handle = self.handles.get(report.get("pid") or report.get("reaped") or 0)
        if "launch" in report:
            self._launches[report["launch"]] = report
        elif handle is not None and "exit" in report:
            handle.returncode = report["exit"]
        elif handle is not None and "reaped" in report:
            handle.reaped = bool(report["ok"])
        return report


class Forked:
    """One engine forked by a launcher: the subset of subprocess.Popen that
    tuner.measure.engine uses (pid, poll, wait, returncode), as watchdog.Watched."""

    def __init__(self, launcher: Launcher, pid: int, argv: list[str]) -> None:
        self.launcher = launcher
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None
        self.reaped: bool | None = None

    def poll(self) -> int | None:
        while self.returncode is None:
            report = self.launcher.read(timeout_s=0)
            if report is None or report.get("eof"):
                break
        if self.returncode is None and not watchdog.running(self.pid):
            # Dead, and the launcher's report of its status is a moment away (as Watched).
            deadline = time.monotonic() + 5.0
            while self.returncode is None and time.monotonic() < deadline:
                if (self.launcher.read(timeout_s=deadline - time.monotonic()) or {}).get("eof"):
                    break
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            if (self.launcher.read(timeout_s=left) or {}).get("eof") and self.returncode is None:
                self.returncode = -signal.SIGKILL
        return self.returncode

    def close(self, *, timeout_s: float) -> bool:
        """Have the launcher make sure the engine's group is gone and its IPC files removed;
        False if that is not confirmed within timeout_s."""
        try:
            if self.launcher.alive():
                self.launcher._send({"reap": self.pid})
                deadline = time.monotonic() + timeout_s
                while self.reaped is None and time.monotonic() < deadline:
                    report = self.launcher.read(timeout_s=deadline - time.monotonic())
                    if (report or {}).get("eof"):
                        break
        except Refused:
            pass  # the launcher is gone, and PR_SET_PDEATHSIG took the engine along
        self.launcher.handles.pop(self.pid, None)
        return bool(self.reaped) or not self.tree_alive()

    def tree_alive(self) -> bool:
        """Whether a process of the engine's group is left (a zombie counts until reaped)."""
        try:
            os.killpg(self.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False


_LAUNCHERS: dict[tuple, Launcher] = {}


def launcher_for(module: str, env: dict[str, str], *, log: IO[bytes]) -> Launcher:
    """This driver's live launcher for `module` under exactly `env` (what vLLM reads while it
    is imported must be what the engine would read), started on first use (its stderr goes
    to `log`); Launcher.wait_ready says when it can fork."""
    key = (sys.executable, module, tuple(sorted(env.items())))
    found = _LAUNCHERS.pop(key, None)
    if found is not None and found.alive():
        _LAUNCHERS[key] = found  # most recently used last
        return found
    while len(_LAUNCHERS) >= KEEP:
        _LAUNCHERS.pop(next(iter(_LAUNCHERS))).close(timeout_s=GROUP_GONE_S)
    if not _LAUNCHERS:
        import atexit

        # The launchers stop by themselves once the driver is gone; waiting for them here
        # means none is seen alive after the driver's exit.
        atexit.unregister(close_all)
        atexit.register(close_all)
    _LAUNCHERS[key] = launcher = Launcher(module=module, env=env, log=log)
    return launcher


def close_all(timeout_s: float = GROUP_GONE_S) -> None:
    """Stop this driver's launchers (their engines with them); they stop by themselves when
    the driver dies, this is for a driver that goes on."""
    while _LAUNCHERS:
        _LAUNCHERS.popitem()[1].close(timeout_s=timeout_s)


def live_launchers() -> list[int]:
    """Pids of this driver's launchers still running."""
    return [la.proc.pid for la in _LAUNCHERS.values() if la.alive()]
