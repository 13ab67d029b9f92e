"""No engine process survives, whatever kills the driver (tuner/measure/watchdog.py), and a second
Ctrl-C cannot cut the engine's teardown short (tuner/measure/engine.py, tuner/cli/__init__.py).

Every driver these tests start carries a marker in its environment, and so does everything it
starts (watchdog, engine, the engine's children), so "nothing left" means: no live process with
the marker. The fake engine's `child_process` stands in for vLLM's EngineCore; the last test
kills a real `tuner bench` driver and watches VLLM::EngineCore itself, found by the engine's
session (its renamed processes hide the marker).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import _PYTHONPATH, ctrl_c_delivered, fake_engine_spec
from test_faults import INTERRUPTED, MARK, _marked

from tuner import cli
from tuner.measure import engine
from tuner.measure.engine import TEARDOWN_GRACE_S, Engine, live_engines
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import TrialConfig
from tuner.testing import leaks
from tuner.testing.leaks import group_members as _group_members

GONE_WITHIN_S = 10.0


@pytest.fixture
def tag() -> Iterator[str]:
    import uuid

    tag = uuid.uuid4().hex[:12]
    yield tag
    # Whatever a failed test left, it must not outlive the test run.
    for line in _marked(tag):
        try:
            os.kill(int(line.split()[1].rstrip(':')), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _env(tag: str) -> dict[str, str]:
    return {**os.environ, MARK: tag, "PYTHONPATH": _PYTHONPATH}


def _state(pid: int) -> tuple[str, int]:
    """(state, ppid) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _gone_after(tag: str, t0: float, *, limit_s: float = GONE_WITHIN_S) -> float:
    """Seconds from t0 until no live process carries the marker; fails past limit_s."""
    while _marked(tag):
        if time.monotonic() - t0 > limit_s:
            pytest.fail(f"engine processes survived {limit_s:.0f} s: {_marked(tag)}")
        time.sleep(0.02)
    return time.monotonic() - t0


def _bench_cmd(out: Path, script: dict, *, tokenizer: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "tuner", "bench", "--num-prompts", "2", "--output-len", "24",
           "--concurrency", "1", "--output-dir", str(out)]
    if script is None:  # the real engine with the embedded model
        return cmd
    return cmd + ["--model", tokenizer or str(EMBEDDED_TOKENIZER),
                  "--vllm-cmd", f"{sys.executable} -m tuner.testing.fake_engine",
                  f"--engine-args=--fake-script '{json.dumps(script)}'"]


def _start_bench(out: Path, tag: str, script: dict | None) -> subprocess.Popen[str]:
    return subprocess.Popen(_bench_cmd(out, script), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=_env(tag), preexec_fn=ctrl_c_delivered)


def _wait_log(proc: subprocess.Popen[str], log: Path, text: str, *, timeout_s: float = 120) -> None:
    """Until `text` is in the engine's log; fails at once, with its output, if the driver ends."""
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and text in log.read_text(errors="replace")):
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the driver exited with {proc.returncode} before '{text}': {out}{err}")
        assert time.monotonic() < deadline, f"'{text}' never appeared in {log}"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


# --- the driver killed: the watchdog stops the engine's tree ----------------------------------
def test_sigkill_of_a_bench_driver_leaves_no_engine_process(tmp_path, tag):
    script = {"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0, "child_process": True}
    proc = _start_bench(tmp_path / "b", tag, script)
    log = tmp_path / "b" / "engine.log"
    try:
        _wait_log(proc, log, "Application startup complete")
        time.sleep(0.5)  # into the measurement
        pid = int(log.read_text().split("Started server process [")[-1].split("]")[0])
        assert len(_group_members(pid)) == 2, "the fake engine and its child should be running"
        assert proc.poll() is None, "the driver ended before it could be killed"
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        gone_s = _gone_after(tag, t0)
    finally:
        _stop(proc)
    assert proc.returncode == -signal.SIGKILL
    assert "its driver is gone" in log.read_text()
    print(f"driver SIGKILL -> engine tree gone in {gone_s:.2f} s")


DAEMON_ENGINE = textwrap.dedent("""
    import os, time
    if os.fork() == 0:
        os.setsid()  # leaves the engine's process group and session
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)  # the grandchild is orphaned at once
    print("engine up", flush=True)
    time.sleep(600)
""")

DRIVER = textwrap.dedent("""
    import json, os, sys, time
    from tuner.measure import watchdog
    with open(sys.argv[1], "ab") as log:
        proc = watchdog.spawn([sys.executable, "-c", sys.argv[2]], env=dict(os.environ), log=log,
                              grace_s=1.0)
    print(json.dumps({"engine": proc.pid, "watchdog": proc.watchdog.pid}), flush=True)
    time.sleep(600)
""")


def test_an_orphan_that_left_the_engines_group_reparents_to_the_watchdog_and_dies(tmp_path,
                                                                                  tag):
    """A descendant that called setsid() is out of reach of any process-group kill; as the
    watchdog is a subreaper it is still its descendant, and is killed with the rest."""
    log = tmp_path / "engine.log"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(log), DAEMON_ENGINE],
                            stdout=subprocess.PIPE, text=True, env=_env(tag),
                            start_new_session=True)
    try:
        pids = json.loads(proc.stdout.readline())
        _wait_log(proc, log, "engine up", timeout_s=30)
        deadline = time.monotonic() + 10
        while True:
            others = [int(line.split()[1].rstrip(':')) for line in _marked(tag)
                      if int(line.split()[1].rstrip(':')) not in (proc.pid, *pids.values())]
            orphans = [p for p in others if _state(p)[1] == pids["watchdog"]]
            if orphans or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert orphans, f"the orphan went to another reaper than the watchdog: {others}"
        assert os.getpgid(orphans[0]) != pids["engine"]  # out of reach of a group kill
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        _gone_after(tag, t0)
    finally:
        _stop(proc)


def test_a_missing_engine_executable_is_the_same_oserror_and_leaves_nothing(tmp_path, tag,
                                                                            monkeypatch):
    monkeypatch.setenv(MARK, tag)  # the watchdog inherits it
    spec = fake_engine_spec(vllm_cmd=(str(tmp_path / "no-such-vllm"),))
    with pytest.raises(FileNotFoundError) as info:
        with Engine(spec, TrialConfig(), log_path=tmp_path / "engine.log"):
            pass
    assert info.value.filename == str(tmp_path / "no-such-vllm")
    assert _marked(tag) == []


# --- Ctrl-C twice: the teardown runs to its end -----------------------------------------------
def test_a_second_sigint_does_not_cut_the_teardown_short(tmp_path, tag):
    """The engine ignores SIGTERM, so teardown waits TEARDOWN_GRACE_S before SIGKILL; a second
    Ctrl-C during that wait used to abandon it, leave the engine running, and still print that
    engines were stopped."""
    script = {"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0, "child_process": True,
              "ignore_sigterm": True}
    proc = _start_bench(tmp_path / "b", tag, script)
    log = tmp_path / "b" / "engine.log"
    try:
        _wait_log(proc, log, "Application startup complete")
        time.sleep(0.5)
        pid = int(log.read_text().split("Started server process [")[-1].split("]")[0])
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(1.5)
        assert proc.poll() is None and len(_group_members(pid)) == 2, \
            "the engine should still be in its grace period: the test exercised nothing"
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=TEARDOWN_GRACE_S + 30)
        took_s = time.monotonic() - t0
    finally:
        _stop(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == INTERRUPTED, err
    # Gone when the driver said so: not a moment later, and not by the watchdog's hand.
    assert _marked(tag) == [] and _group_members(pid) == []
    assert "its driver is gone" not in log.read_text()
    assert took_s >= TEARDOWN_GRACE_S - 1, f"teardown ended after {took_s:.1f} s"


def test_interrupted_says_which_engine_is_still_running(tmp_path, tag, monkeypatch, capsys):
    """When teardown could not stop an engine (simulated: neither the driver's reap nor the
    watchdog acts), the CLI names it instead of saying engines were stopped."""
    monkeypatch.setattr(engine, "reap_group", lambda proc, *, grace_s: None)
    closes = []
    monkeypatch.setattr(engine.watchdog.Watched, "close",
                        lambda self, *, timeout_s: closes.append(self) or False)
    started: list[Engine] = []

    def bench(_args) -> int:
        eng = Engine(fake_engine_spec(env={MARK: tag}), TrialConfig(),
                     log_path=tmp_path / "engine.log")
        started.append(eng)
        with eng:
            raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "bench", bench)
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        code = cli.main(["bench"])
        pid = closes[0].pid
        err = capsys.readouterr().err
        assert code == 130
        assert live_engines() == [pid]
        assert f"tuner: interrupted; engine pid {pid} is still running" in err
        assert f"kill -KILL -- -{pid}" in err and "engines were stopped" not in err
    finally:
        signal.signal(signal.SIGTERM, sigterm)  # main() set its own
        monkeypatch.undo()
        for handle in closes:
            handle.close(timeout_s=15)
    assert live_engines() == [] and _marked(tag) == []


# --- the real engine ---------------------------------------------------------------------------
_session = leaks.session_members  # the real engine's processes, renamed by vLLM


@pytest.mark.engine
def test_sigkill_of_a_real_bench_driver_takes_vllms_engine_core_along(tmp_path, tag):
    pytest.importorskip("vllm", reason="the vLLM CPU build is not installed (scripts/setup.sh)")
    proc = _start_bench(tmp_path / "b", tag, None)
    log = tmp_path / "b" / "engine.log"
    try:
        _wait_log(proc, log, "Application startup complete", timeout_s=900)
        _wait_log(proc, log, "POST /v1/")  # mid-trial
        sid = int(log.read_text().split("Started server process [")[-1].split("]")[0])
        cores = [line for line in _session(sid) if "VLLM::EngineCore" in line]
        assert cores, f"no VLLM::EngineCore among {_session(sid)}"
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        while [line for line in _session(sid) if "VLLM::EngineCore" in line]:
            assert time.monotonic() - t0 < GONE_WITHIN_S, f"EngineCore alive: {_session(sid)}"
            time.sleep(0.02)
        core_s = time.monotonic() - t0
        while _session(sid):
            assert time.monotonic() - t0 < GONE_WITHIN_S, f"engine alive: {_session(sid)}"
            time.sleep(0.02)
        all_s = _gone_after(tag, t0)  # the watchdog too
    finally:
        _stop(proc)
    print(f"real driver SIGKILL -> VLLM::EngineCore gone in {core_s:.2f} s, "
          f"every engine process in {all_s:.2f} s")
