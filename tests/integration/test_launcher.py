"""The fast start (tuner/measure/launcher.py): engines forked from a launcher are reaped on every
path (normal end, failed start, SIGKILL of the driver, Ctrl-C), a refused launcher falls back to
a new process with one line saying why, and no engine is ever reused, within a driver or across
two. The fake engine stands in for vLLM (the launcher forks whatever module it is told); the
real CPU engine's forked launches are in test_real_engine.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuner.errors import EngineCrashed
from tuner.measure import engine as engine_mod
from tuner.measure import launcher
from tuner.records.configs import TrialConfig
from tuner.testing import leaks

FAKE = "tuner.testing.fake_engine"
FAKE_CMD = (sys.executable, "-m", FAKE)

# A driver in its own process: forks a fake engine (child_process: a second process in its
# group, as vLLM's EngineCore) and says who is who, then waits to be killed or interrupted.
DRIVER = textwrap.dedent(f"""
    import json, sys, time
    from pathlib import Path
    from tuner.measure import engine, launcher
    from tuner.records.configs import TrialConfig
    from tuner.testing import fake_script
    launcher.MODULES = launcher.MODULES + ({FAKE!r},)
    engine.entry_point = lambda spec: ({FAKE_CMD!r}, "fake")
    spec = fake_script.engine_spec(child_process=True, vllm_cmd=())
    with engine.Engine(spec, TrialConfig(), log_path=Path(sys.argv[1])) as eng:
        print(json.dumps({{"engine": eng.proc.pid, "port": eng.port, "ipc": eng._ipc_dir,
                          "launchers": launcher.live_launchers(),
                          "start": eng.info.details["start"]}}), flush=True)
        while True:
            time.sleep(0.1)
""")


@pytest.fixture
def forking(monkeypatch):
    """Engines of the fake's spec are forked from a launcher, as vLLM's are."""
    monkeypatch.setattr(launcher, "MODULES", launcher.MODULES + (FAKE,))
    monkeypatch.setattr(engine_mod, "entry_point", lambda spec: (FAKE_CMD, "fake"))
    yield
    launcher.close_all()
    engine_mod._REFUSED.clear()


def _spec(fake_spec, **kwargs):
    return fake_spec(vllm_cmd=(), **kwargs)


def _gone(pgid: int, wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while leaks.group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not leaks.group_members(pgid)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def test_a_forked_engine_is_its_own_session_and_is_reaped_at_its_end(forking, fake_spec,
                                                                     tmp_path):
    spec = _spec(fake_spec, child_process=True)
    with engine_mod.Engine(spec, TrialConfig(), log_path=tmp_path / "engine.log") as eng:
        pid, ipc = eng.proc.pid, Path(eng._ipc_dir)
        assert eng.info.details["start"] == engine_mod.FORKED
        assert os.getsid(pid) == pid == os.getpgid(pid)  # its own session and group
        assert _parent(pid) in launcher.live_launchers()
        assert len(leaks.group_members(pid)) == 2  # the fake and its child
        assert ipc.is_dir() and ipc.name.startswith("tuner-vllm-ipc-")
    assert not leaks.group_members(pid) and not ipc.exists()
    assert engine_mod.live_engines() == []


def test_a_forked_engine_that_fails_at_start_is_reaped_with_vllms_reason(forking, fake_spec,
                                                                        tmp_path):
    spec = _spec(fake_spec, crash_on_start="ValueError: num_speculative_tokens must be > 0",
                 child_process=True)
    eng = engine_mod.Engine(spec, TrialConfig(), log_path=tmp_path / "engine.log")
    with pytest.raises(EngineCrashed, match="num_speculative_tokens must be > 0"):
        with eng:
            pass
    assert eng.info is None and eng.proc is None
    assert engine_mod.live_engines() == []
    assert not Path(eng._ipc_dir).exists()


def test_no_engine_is_reused_each_trial_gets_its_own(forking, fake_spec, tmp_path):
    """Two engines one after the other from one launcher: two processes, sessions, ports and
    keys; the first is gone before the second starts."""
    seen = []
    for i in range(2):
        with engine_mod.Engine(_spec(fake_spec), TrialConfig(),
                               log_path=tmp_path / f"{i}.log") as eng:
            seen.append((eng.proc.pid, eng.port, eng.api_key, eng._ipc_dir,
                         _parent(eng.proc.pid)))
        assert not leaks.group_members(seen[-1][0])
    (pid1, port1, key1, ipc1, la1), (pid2, port2, key2, ipc2, la2) = seen
    assert pid1 != pid2 and key1 != key2 and ipc1 != ipc2
    assert la1 == la2  # one launcher, two forks


def test_two_drivers_do_not_share_a_launcher_or_an_engine(tmp_path):
    """Two studies on one machine: each driver forks its engines from its own launcher."""
    import json

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / f"{i}.log")],
                              stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
             for i in range(2)]
    try:
        said = [json.loads(p.stdout.readline()) for p in procs]
        a, b = said
        assert a["start"] == b["start"] == engine_mod.FORKED
        assert a["engine"] != b["engine"] and a["port"] != b["port"]
        assert set(a["launchers"]).isdisjoint(b["launchers"])
        assert _parent(a["engine"]) in a["launchers"] and _parent(b["engine"]) in b["launchers"]
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    for s in said:
        assert _gone(s["engine"]), f"engine {s['engine']} survived its killed driver"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_a_killed_or_interrupted_driver_leaves_no_engine_and_no_launcher(tmp_path, sig):
    import json

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "engine.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        said = json.loads(proc.stdout.readline())
        members = leaks.group_members(said["engine"])
        assert len(members) == 2, members
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert _gone(said["engine"]), leaks.group_members(said["engine"])
    deadline = time.monotonic() + 10
    while any(leaks._stat_fields(str(p)) not in (None,) and leaks._stat_fields(str(p))[0]
              not in "ZX" for p in said["launchers"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in said["launchers"]:
        fields = leaks._stat_fields(str(p))
        assert fields is None or fields[0] in "ZX", f"launcher {p} survived its driver"
    assert not Path(said["ipc"]).exists()
    by_launcher = "its driver is gone" in (tmp_path / "engine.log").read_text()
    if sig == signal.SIGINT:
        assert proc.returncode != 0  # KeyboardInterrupt, after the engine was stopped
        assert not by_launcher, "the driver's own teardown was cut short"
    else:
        assert by_launcher, "the launcher did not say why it stopped the engine"
    assert not leaks.listening(said["port"])


def test_a_refused_launcher_falls_back_to_a_new_process_saying_why(forking, fake_spec,
                                                                  tmp_path, monkeypatch, caplog):
    def refuse(*_args, **_kwargs):
        raise launcher.Refused("importing vllm failed: simulated")

    monkeypatch.setattr(launcher, "launcher_for", refuse)
    log = tmp_path / "engine.log"
    with caplog.at_level("WARNING", logger="tuner"):
        with engine_mod.Engine(_spec(fake_spec), TrialConfig(), log_path=log) as eng:
            details = eng.info.details
            assert _parent(eng.proc.pid) not in launcher.live_launchers()
    assert details["start"] == engine_mod.SPAWNED
    assert details["fast_start_refused"] == "importing vllm failed: simulated"
    assert "# tuner: fast start refused (importing vllm failed: simulated); starting vLLM as " \
           "a new process" in log.read_text()
    assert [r.getMessage() for r in caplog.records].count(
        "tuner: fast start refused (importing vllm failed: simulated); starting vLLM as a new "
        "process") == 1


def test_a_launcher_that_cannot_import_its_module_is_refused_in_one_line(tmp_path):
    with open(tmp_path / "launcher.log", "ab") as log, \
            pytest.raises(launcher.Refused, match="importing no_such_module_here failed: "
                                                  "ModuleNotFoundError"):
        launcher.Launcher(module="no_such_module_here", env=dict(os.environ),
                          log=log).wait_ready(timeout_s=60)


def test_fast_start_is_off_with_the_flag_or_a_vllm_cmd(fake_spec):
    argv = [sys.executable, "-m", launcher.API_SERVER, "--port", "1"]
    spec = fake_spec(vllm_cmd=())
    assert engine_mod.fast_start_applies(spec, argv)
    assert not engine_mod.fast_start_applies(spec.model_copy(update={"fast_start": False}), argv)
    assert not engine_mod.fast_start_applies(fake_spec(), [*FAKE_CMD, "--port", "1"])
    assert not engine_mod.fast_start_applies(spec, ["/opt/vllm/bin/vllm", "serve", "m"])


def test_a_start_that_fails_before_its_process_exists_leaves_no_ipc_folder(fake_spec, tmp_path):
    spec = fake_spec(vllm_cmd=("/nonexistent/vllm-here", "serve"))
    eng = engine_mod.Engine(spec, TrialConfig(), log_path=tmp_path / "engine.log")
    with pytest.raises(OSError):
        with eng:
            pass
    assert eng._ipc_dir and not Path(eng._ipc_dir).exists()
