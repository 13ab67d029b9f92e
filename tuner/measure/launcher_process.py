"""Engine stage: the launcher process, run as `python -m tuner.measure.launcher_process` by its
driver (tuner.measure.launcher, which holds the driver's side and the protocol).

It imports torch and vLLM's server module once, and then forks one engine per request. Each
fork starts a session and process group of its own, takes its trial's argv (port, API key,
flags), environment and log, and runs vLLM's entry module as `python -m` runs it. The launcher
itself never serves or computes: a fork starts from the state a fresh interpreter reaches right
after those imports, and nothing of one trial's engine reaches the next one's (a new fork each
time). It is a child subreaper, learns of its driver's death from EOF on its stdin, and then
stops every engine tree it started, SIGTERM then SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import sys
import time

from tuner.measure import watchdog
from tuner.measure.launcher import API_SERVER, GROUP_GONE_S, MODULES


def _report(**fields: object) -> None:
    watchdog._report(**fields)


def _import(module: str) -> None:
    """What every engine of `module` imports first: torch and vLLM's server for vLLM's
    entry points (tests fork the fake engine, tuner.testing.fake_engine)."""
    import importlib

    if module in MODULES:
        importlib.import_module("torch")
        importlib.import_module(API_SERVER)
    importlib.import_module(module)
    # CUDA does not survive a fork: an engine forked from here must initialise it itself.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised while vLLM was imported")


def _run_engine(request: dict, *, launcher_pid: int, close_fds: tuple[int, ...],
                led_fd: int) -> int:
    """In the fork: become the engine's session leader, take the trial's log, environment and
    argv, and run the module as `python -m` runs it. Returns the exit status."""
    os.setsid()
    os.close(led_fd)
    watchdog._prctl(watchdog.PR_SET_PDEATHSIG, signal.SIGKILL)  # if the launcher is killed
    if os.getppid() != launcher_pid:
        return 1  # it died before prctl: nobody would stop this engine
    signal.set_wakeup_fd(-1)
    for fd in close_fds:
        os.close(fd)
    # A fresh interpreter's handlers (the launcher ignores Ctrl-C and catches SIGTERM).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(log, 1)  # never the report pipe: only the launcher writes there
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(request["env"])
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()  # a fresh interpreter's global RNG state (`random` reseeds at fork)
    argv = request["argv"]
    module = argv[2]
    sys.argv = [argv[0], *argv[3:]]
    # `python -m` runs the module as __main__, beside (not instead of) an imported copy.
    sys.modules.pop(module, None)
    import runpy
    import threading
    import traceback

    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does at exit: wait for non-daemon threads, run atexit handlers.
    import atexit

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


class _Engines:
    """The engines this launcher forked: their groups, what to remove once each is gone."""

    def __init__(self, wake_fd: int) -> None:
        self.wake_fd = wake_fd
        self.cleanup: dict[int, list[str]] = {}  # live engine pid -> IPC dirs to remove
        self.logs: dict[int, str] = {}  # live engine pid -> its engine.log
        self.exited: set[int] = set()

    def say(self, pid: int, message: str) -> None:
        """A line in the engine's own log: whoever reads it learns what happened to it."""
        try:
            with open(self.logs[pid], "a") as log:
                log.write(f"# tuner launcher (pid {os.getpid()}): {message}\n")
        except (KeyError, OSError):
            pass

    def reap(self) -> bool:
        """Reap every exited child (orphans of engine trees reparent to us); report an
        engine's exit and kill what its leader left behind. False once no child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid in self.cleanup and pid not in self.exited:
                self.exited.add(pid)
                _report(pid=pid, exit=os.waitstatus_to_exitcode(status))
                _killpg(pid, signal.SIGKILL)

    def sleep(self, seconds: float) -> None:
        watchdog._Tree(0, self.wake_fd).sleep(seconds)

    def reap_group(self, pid: int) -> bool:
        """SIGKILL the engine's group until it is empty; remove its IPC dirs."""
        deadline = time.monotonic() + GROUP_GONE_S
        while True:
            self.reap()
            if not _group_alive(pid) or time.monotonic() > deadline:
                break
            _killpg(pid, signal.SIGKILL)
            self.sleep(0.05)
        gone = not _group_alive(pid)
        for path in self.cleanup.pop(pid, []) if gone else []:
            shutil.rmtree(path, ignore_errors=True)
        if gone:
            self.logs.pop(pid, None)
        return gone

    def stop_all(self, *, grace_s: float) -> bool:
        """SIGTERM every engine tree, SIGKILL after grace_s; True once no child is left."""
        tree = watchdog._Tree(0, self.wake_fd)

        def signal_all(sig: int) -> None:
            for pid in self.cleanup:
                _killpg(pid, sig)
            tree_pids = tree.descendants()
            for pid in tree_pids:
                try:
                    os.kill(pid, sig)
                    if sig == signal.SIGTERM:
                        os.kill(pid, signal.SIGCONT)
                except (ProcessLookupError, PermissionError):
                    pass

        signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.reap() and time.monotonic() < deadline:
            self.sleep(deadline - time.monotonic())
        deadline = time.monotonic() + watchdog.KILL_WAIT_S
        done = True
        while self.reap():
            if time.monotonic() > deadline:
                done = False
                break
            signal_all(signal.SIGKILL)
            self.sleep(0.05)
        for pid in list(self.cleanup):
            if not _group_alive(pid):
                for path in self.cleanup.pop(pid):
                    shutil.rmtree(path, ignore_errors=True)
        return done


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
        if sig == signal.SIGTERM:
            os.killpg(pgid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tuner.measure.launcher_process",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--module", default=API_SERVER, help="what each engine runs, as python -m")
    p.add_argument("--grace-s", type=float, default=3.0,
                   help="between SIGTERM and SIGKILL once the driver is gone")
    args = p.parse_args(argv)
    # Ctrl-C is the driver's to handle; SIGTERM means "stop every engine", as the driver's EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    t0 = time.monotonic()
    try:
        _import(args.module)
    except BaseException as e:  # noqa: BLE001 - any failure here only means "start as before"
        _report(refused=f"importing {args.module} failed: {type(e).__name__}: "
                        f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
        return 0
    watchdog._prctl(watchdog.PR_SET_CHILD_SUBREAPER, 1)
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: terminated.append(signum))
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    _report(ready=round(time.monotonic() - t0, 3))
    engines = _Engines(wake_r)
    me = os.getpid()
    buffer = b""
    driver_gone = False
    while not driver_gone and not terminated:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            engines.sleep(0)
        engines.reap()
        if 0 not in ready:
            continue
        chunk = os.read(0, 1 << 16)
        driver_gone = not chunk
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            if "reap" in request:
                _report(reaped=request["reap"], ok=engines.reap_group(request["reap"]))
                continue
            try:
                log_ok = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.close(log_ok)
            except OSError as e:
                _report(launch=request["launch"], error=[e.errno, e.strerror, e.filename])
                continue
            # The fork says when it leads its own session: only then may the driver signal
            # its group (before, it is in ours), as the watchdog reports an exec'd engine.
            led_r, led_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(led_r)
                    code = _run_engine(request, launcher_pid=me,
                                       close_fds=(wake_r, wake_w), led_fd=led_w)
                finally:
                    os._exit(code)
            os.close(led_w)
            with os.fdopen(led_r, "rb") as led:
                led.read()  # EOF: the fork closed it (session led) or is gone
            engines.cleanup[pid] = list(request.get("cleanup", []))
            engines.logs[pid] = request["log"]
            _report(launch=request["launch"], pid=pid)
    why = "its driver is gone (EOF on the pipe)" if driver_gone else "SIGTERM"
    t0 = time.monotonic()
    live = list(engines.cleanup)
    for pid in live:
        engines.say(pid, f"{why}; stopping engine pid {pid} and its whole process tree")
    done = engines.stop_all(grace_s=args.grace_s)
    for pid in live:
        engines.say(pid, f"engine tree {'stopped' if done else 'NOT stopped'} in "
                         f"{time.monotonic() - t0:.1f} s")
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
