"""Engine stage: one watchdog process per engine, so that no engine process outlives its driver.

PR_SET_PDEATHSIG reaches only the direct child, and vLLM's API server starts EngineCore and
workers that a killed driver would orphan to PID 1, holding their memory (the whole card on a
GPU). So:

    driver --pipe--> watchdog (child subreaper, own session) --> engine (own session) --> ...

- The watchdog is a child subreaper: every orphan of the engine's tree reparents to it.
- It learns of its driver's death from EOF on its stdin, a pipe whose only write end the driver
  holds: the kernel closes it however the driver dies, and no pid is polled.
- On EOF (or SIGTERM) it stops the tree (SIGTERM to the group and every descendant, SIGKILL
  after a grace) and exits; when the engine exits on its own it reports the status, kills what
  the engine left behind, and exits.

The driver side is `spawn`, whose `Watched` stands in for subprocess.Popen (pid, poll(), wait(),
returncode are the engine's). Stdlib only, run as `python -I -S <this file>`: it starts in tens
of milliseconds and imports nothing of the package.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PF_EXITING = 0x4  # /proc/PID/stat flags: the process has begun to exit
START_TIMEOUT_S = 60.0  # the watchdog's own start-up; seconds even on a loaded 2-core host
KILL_WAIT_S = 10.0  # after SIGKILL: a dying process still frees its memory before it is gone


# --- the driver's side -------------------------------------------------------------------------
class Watched:
    """The engine as its driver sees it, through its watchdog: the subset of subprocess.Popen
    that tuner.measure.engine uses (pid, poll, wait, returncode), all of them the engine's."""

    def __init__(self, watchdog: subprocess.Popen[bytes], argv: list[str]) -> None:
        self.watchdog = watchdog
        self.args = argv
        self.pid = 0
        self.returncode: int | None = None
        self._buffer = b""

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(timeout_s=0)
        if self.returncode is None and not self._running():
            # Dead, and the watchdog's report of its exit status is a moment away: a caller
            # that saw the engine's socket close must not then be told it is still alive.
            deadline = time.monotonic() + 5.0
            while self.returncode is None and time.monotonic() < deadline:
                self._read(timeout_s=deadline - time.monotonic())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read(timeout_s=left)
        return self.returncode

    def close(self, *, timeout_s: float) -> bool:
        """Drop the pipe (the watchdog stops whatever is left of the tree, then exits) and
        reap the watchdog; False if it is still at work after timeout_s."""
        try:
            if self.watchdog.stdin is not None:
                self.watchdog.stdin.close()
        except OSError:
            pass
        try:
            self.watchdog.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # Left running, it keeps killing; subprocess reaps it once it exits.
            return False
        while self.returncode is None and self._read(timeout_s=0) is not None:
            pass
        return True

    def tree_alive(self) -> bool:
        """Whether anything of this engine may still run: its watchdog (which exits only once
        the tree is gone) or a process of the engine's group."""
        if self.watchdog.poll() is None:
            return True
        try:
            os.killpg(self.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def _running(self) -> bool:
        return running(self.pid)

    def _read(self, *, timeout_s: float | None) -> dict | None:
        """Wait up to timeout_s (None: forever) for the watchdog's next report and apply it."""
        if b"\n" not in self._buffer:
            assert self.watchdog.stdout is not None
            fd = self.watchdog.stdout.fileno()
            ready, _, _ = select.select([fd], [], [], timeout_s)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                # The watchdog is gone without a word: killed itself, so PR_SET_PDEATHSIG
                # has killed the engine too.
                if self.returncode is None:
                    self.returncode = -signal.SIGKILL
                return {"eof": True}
            self._buffer += chunk
            if b"\n" not in self._buffer:
                return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        report = json.loads(line)
        if "pid" in report:
            self.pid = report["pid"]
        if "exit" in report:
            self.returncode = report["exit"]
        return report


def running(pid: int) -> bool:
    """The process is neither gone, nor exiting, nor a zombie waiting for its parent (its pid
    cannot be reused before that). Exiting counts: it has closed its sockets already, so a
    client sees it dead a millisecond before it is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] not in "ZX" and not int(fields[6]) & PF_EXITING


def spawn(argv: list[str], *, env: dict[str, str], log: IO[bytes], grace_s: float,
          cleanup: tuple[str, ...] = ()) -> Watched:
    """Start `argv` under a new watchdog; returns once the engine process exists. Raises the
    OSError that exec raised (a missing executable), as subprocess.Popen would. The folders
    in `cleanup` (the engine's IPC sockets) are removed once its tree is gone."""
    watchdog = subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--grace-s", str(grace_s)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
        # Its own session: Ctrl-C at the terminal and a kill of the driver's process group
        # must not take the watchdog along, only the driver (the pipe tells it).
        start_new_session=True)
    handle = Watched(watchdog, argv)
    try:
        assert watchdog.stdin is not None
        watchdog.stdin.write(json.dumps({"argv": argv, "env": env,
                                         "cleanup": list(cleanup)}).encode() + b"\n")
        watchdog.stdin.flush()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not handle.pid:
            report = handle._read(timeout_s=max(0.0, deadline - time.monotonic()))
            if report is not None and "error" in report:
                errno, strerror, filename = report["error"]
                raise OSError(errno, strerror, filename)
            if (report is not None and "eof" in report) or time.monotonic() > deadline:
                raise RuntimeError(f"the engine's watchdog did not start (exit status "
                                   f"{watchdog.poll()}); its error is in {log.name}")
    except BaseException:
        handle.close(timeout_s=grace_s + KILL_WAIT_S)
        raise
    return handle


# --- the watchdog's side -----------------------------------------------------------------------
def _prctl(option: int, value: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # already loaded: no file is opened
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def _report(**fields: object) -> None:
    try:
        os.write(1, json.dumps(fields).encode() + b"\n")
    except OSError:
        pass  # the driver is gone; nobody is listening


def _say(message: str) -> None:
    # The engine's log (our stderr): whoever reads it later learns what happened to the tree.
    os.write(2, f"# tuner watchdog (pid {os.getpid()}): {message}\n".encode())


def _launch(argv: list[str], env: dict[str, str]) -> int:
    """Fork and exec the engine in its own session; exec's OSError comes back through a pipe."""
    errors_r, errors_w = os.pipe()  # close-on-exec: EOF alone means the exec succeeded
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # if the watchdog itself is killed
            if os.getppid() != me:
                os._exit(1)  # it died before prctl: nobody would stop this engine
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD,
                        signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)  # ignored ones would survive exec
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(2, 1)  # the log; never the report pipe, so only the watchdog holds it
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            os.write(errors_w, json.dumps([e.errno, e.strerror, e.filename]).encode())
        finally:
            os._exit(127)
    os.close(errors_w)
    with os.fdopen(errors_r, "rb") as f:
        failure = f.read()
    if failure:
        os.waitpid(pid, 0)
        errno, strerror, filename = json.loads(failure)
        raise OSError(errno, strerror, filename)
    return pid


class _Tree:
    """The engine's process tree, seen from the subreaper at its root."""

    def __init__(self, engine_pid: int, wake_fd: int) -> None:
        self.engine_pid = engine_pid
        self.wake_fd = wake_fd
        self.exit_code: int | None = None

    def reap(self) -> bool:
        """Reap every exited child (orphans reparent to us); False once no child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.engine_pid:
                self.exit_code = os.waitstatus_to_exitcode(status)

    def descendants(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        found, todo = [], list(children.get(os.getpid(), []))
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def signal(self, sig: int) -> None:
        """The engine's process group and every descendant, also those that left the group."""
        targets = [(os.killpg, self.engine_pid)] + [(os.kill, p) for p in self.descendants()]
        for send, target in targets:
            try:
                send(target, sig)
                if sig == signal.SIGTERM:
                    send(target, signal.SIGCONT)  # a stopped process keeps SIGTERM pending
            except (ProcessLookupError, PermissionError):
                pass

    def sleep(self, seconds: float) -> None:
        """Sleep until a child exits (SIGCHLD writes to wake_fd) or `seconds` pass."""
        if select.select([self.wake_fd], [], [], max(0.0, seconds))[0]:
            try:
                os.read(self.wake_fd, 4096)
            except BlockingIOError:
                pass

    def stop(self, *, grace_s: float) -> bool:
        """SIGTERM, up to grace_s for the tree to go, then SIGKILL until it has; True when
        no child is left."""
        if grace_s > 0:
            self.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.reap() and time.monotonic() < deadline:
                self.sleep(deadline - time.monotonic())
        deadline = time.monotonic() + KILL_WAIT_S
        while self.reap():
            if time.monotonic() > deadline:
                return False
            self.signal(signal.SIGKILL)  # again each round: a process may have forked
            self.sleep(0.05)
        return True


def _read_request() -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(0, 1 << 16)
        if not chunk:
            raise SystemExit(0)  # the driver died before it said what to start
        data += chunk
    return json.loads(data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tuner.measure.watchdog", description=__doc__.split("\n\n")[0])
    p.add_argument("--grace-s", type=float, default=3.0,
                   help="between SIGTERM and SIGKILL once the driver is gone")
    args = p.parse_args(argv)
    request = _read_request()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    # Ctrl-C is the driver's to handle; SIGTERM means "stop the tree", as the driver's EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: terminated.append(signum))
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # a signal wakes select() below: no polling
    try:
        engine_pid = _launch(request["argv"], request["env"])
    except OSError as e:
        _report(error=[e.errno, e.strerror, e.filename])
        return 0
    _report(pid=engine_pid)
    tree = _Tree(engine_pid, wake_r)
    driver_gone = False
    while tree.exit_code is None and not driver_gone and not terminated:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            tree.sleep(0)
        if 0 in ready:
            driver_gone = not os.read(0, 4096)
        tree.reap()
    if tree.exit_code is not None:
        _report(exit=tree.exit_code)
        # The leader is gone: what it left behind serves nobody (reap_group SIGKILLs it too).
        done = tree.stop(grace_s=0)
    else:
        t0 = time.monotonic()
        _say("its driver is gone (EOF on the pipe)" if driver_gone else "SIGTERM")
        _say(f"stopping engine pid {engine_pid} and its whole process tree")
        done = tree.stop(grace_s=args.grace_s)
        _say(f"engine tree {'stopped' if done else 'NOT stopped'} in "
             f"{time.monotonic() - t0:.1f} s")
        if tree.exit_code is not None:
            _report(exit=tree.exit_code)
    if done:
        # The sockets a killed vLLM could not unlink; nothing else uses these folders.
        import shutil

        for path in request.get("cleanup", []):
            shutil.rmtree(path, ignore_errors=True)
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
