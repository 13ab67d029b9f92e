"""Faults on the fake engine: every injected fault ends as data (a FAIL trial with its reason,
or errored records counted in a level), never as a lost trial or a leftover process.

The same faults run against the real vLLM CPU engine in scripts/fault_drill.py; here the fake
engine keeps them fast. Every engine these tests start carries a marker in its environment,
so "no leftover process" means: no live process with that marker, none in the engine's
process group, and nothing listening on the engine's port.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import optuna
import pytest
from conftest import ctrl_c_delivered, fake_engine_spec

from tuner import api
from tuner.errors import EngineStartTimeout
from tuner.measure import trial as runner
from tuner.measure.engine import TEARDOWN_GRACE_S, Engine
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, Prompt, TrialConfig, Workload, WorkloadSpec
from tuner.records.options import OptimizeOptions
from tuner.search import study as st
from tuner.testing import leaks

MARK = "TUNER_FAULT_TEST"
INTERRUPTED = "tuner: interrupted; engines were stopped, finished results are kept."
BAD_WINDOW = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
              "prompt_lookup_max": 2}


# --- what "nothing left behind" means (tuner.testing.leaks) -----------------------------------
def _marked(tag: str) -> list[str]:
    """Live (non-zombie) processes whose environment carries MARK=tag, as "pid N: cmdline"."""
    return leaks.marked_processes(MARK, tag)


def _engine_of(log: Path) -> tuple[int, int]:
    """(pid, port) of the engine that wrote `log` (the last start in it)."""
    found = leaks.engine_of(log)
    assert found is not None, f"no engine start in {log}"
    return found


def assert_nothing_left(tag: str, *, pgids: tuple[int, ...] = (), ports: tuple[int, ...] = (),
                        wait_s: float = 10.0) -> None:
    """A killed driver's watchdog needs a moment to tear the engine tree down: allow for it."""
    left = leaks.leftovers(MARK, tag, pgids=pgids, ports=ports, wait_s=wait_s)
    assert not left, f"engine processes survived: {left}"


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:12]


def _spec(tag: str, **kwargs):
    return fake_engine_spec(env={MARK: tag}, **kwargs)


def _workload(n: int = 40, output_len: int = 12) -> Workload:
    # Enough distinct prompts for every level below (no engine is sent a prompt twice).
    prompts = tuple(Prompt(prompt=f"p{i} a b c", prompt_len=5, output_len=output_len)
                    for i in range(n))
    return Workload(spec=WorkloadSpec(name="random", num_prompts=n), prompts=prompts)


# --- engine faults, one trial each ------------------------------------------------------------
def test_engine_exiting_at_start_up_is_a_failure_with_vllms_reason(tmp_path, tag):
    out = runner.measure_outcome(_spec(tag, child_process=True),
                                 TrialConfig(speculative_config=BAD_WINDOW), _workload(),
                                 MeasureSettings(), str(tmp_path))
    f = out.failure
    assert f.kind == "engine_crashed"
    assert "prompt_lookup_min=5 must be <= prompt_lookup_max=2" in f.reason
    assert_nothing_left(tag)


def test_engine_dying_mid_measurement_is_engine_died(tmp_path, tag):
    spec = _spec(tag, child_process=True, die_after_requests=4, tpot_ms=5)
    out = runner.measure_outcome(spec, TrialConfig(), _workload(output_len=20),
                                 MeasureSettings(num_requests=12), str(tmp_path))
    f = out.failure
    assert f.kind == "engine_died"
    assert "vLLM exited during the c=1 level" in f.reason
    assert "scripted die_after_requests" in f.log_tail
    pid, port = _engine_of(tmp_path / "engine.log")
    assert_nothing_left(tag, pgids=(pid,), ports=(port,))


def test_engine_hanging_before_health_is_a_start_timeout(tmp_path, tag):
    out = runner.measure_outcome(_spec(tag, hang_before_health=True, ready_timeout_s=1.0),
                                 TrialConfig(), _workload(), MeasureSettings(), str(tmp_path))
    assert out.failure.kind == "engine_start_timeout"
    assert "did not answer /health within 1 s" in out.failure.reason
    assert_nothing_left(tag)


def test_a_stopped_engine_group_is_reaped_without_waiting_out_the_grace(tmp_path, tag):
    """SIGSTOP (a hang vLLM cannot produce on demand): SIGTERM stays pending in a stopped
    process, so teardown must SIGCONT it rather than wait TEARDOWN_GRACE_S for nothing."""
    spec = _spec(tag, hang_before_health=True, child_process=True, ready_timeout_s=3.0)
    eng = Engine(spec, TrialConfig(), log_path=tmp_path / "engine.log")
    stopped: list[int] = []

    def stop_group() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            proc = eng.proc
            if proc is not None and len(leaks.group_members(proc.pid)) >= 2:  # the fake and its child
                os.killpg(proc.pid, signal.SIGSTOP)
                stopped.append(proc.pid)
                return
            time.sleep(0.02)

    threading.Thread(target=stop_group, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(EngineStartTimeout):
        with eng:
            pass
    elapsed = time.monotonic() - t0
    assert stopped, "the group was never stopped: the test exercised nothing"
    assert elapsed < 3.0 + TEARDOWN_GRACE_S / 2, f"teardown of a stopped group took {elapsed:.0f} s"
    assert_nothing_left(tag, pgids=(stopped[0],))


def test_stalled_requests_time_out_then_the_trial_fails(tmp_path, tag):
    spec = _spec(tag, stall_requests=True, request_timeout_s=1.0)
    out = runner.measure_outcome(spec, TrialConfig(), _workload(n=3),
                                 MeasureSettings(num_requests=2), str(tmp_path))
    f = out.failure
    assert f.kind == "measurement_failed"
    assert "2 of 2 requests failed" in f.reason and "timed out after 1 s" in f.reason
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all("timed out" in r["error"] for r in records)  # 1 warm-up
    pid, port = _engine_of(tmp_path / "engine.log")
    assert_nothing_left(tag, pgids=(pid,), ports=(port,))


def test_a_level_past_its_timeout_fails_the_trial(tmp_path, tag):
    spec = _spec(tag, stall_requests=True, request_timeout_s=30.0, level_timeout_s=0.5)
    out = runner.measure_outcome(spec, TrialConfig(), _workload(n=3), MeasureSettings(),
                                 str(tmp_path))
    assert out.failure.kind == "measurement_failed"
    assert "did not finish within" in out.failure.reason
    assert_nothing_left(tag)


def test_few_malformed_chunks_and_http_errors_are_counted_in_the_level(tmp_path, tag):
    # Server-side request numbers 2..31 are measured (1 is the warm-up): 10, 20 malformed,
    # 15 and 30 HTTP 500 (30 is checked for the HTTP error first): 4 of 30, under 20 %.
    spec = _spec(tag, malformed_every=10, http_error_every=15)
    out = runner.measure_outcome(spec, TrialConfig(), _workload(n=31),
                                 MeasureSettings(num_requests=30), str(tmp_path))
    (level,) = out.result.levels
    assert (level.failed, level.completed, level.num_requests) == (4, 26, 30)
    assert any("malformed JSON chunk" in e for e in level.errors)
    assert any(e.startswith("HTTP 500") for e in level.errors)
    assert_nothing_left(tag)


def test_many_malformed_chunks_and_http_errors_fail_the_trial(tmp_path, tag):
    spec = _spec(tag, malformed_every=2, http_error_every=3)
    out = runner.measure_outcome(spec, TrialConfig(), _workload(n=13),
                                 MeasureSettings(num_requests=12), str(tmp_path))
    f = out.failure
    assert f.kind == "measurement_failed"
    assert re.search(r"c=1: \d+ of 12 requests failed", f.reason)
    failed = sum(1 for line in (tmp_path / "requests.jsonl").read_text().splitlines()
                 if json.loads(line)["error"] and not json.loads(line)["warmup"])
    assert failed > 0.2 * 12
    assert_nothing_left(tag)


def test_a_port_taken_between_probe_and_bind_is_retried_on_another(tmp_path, tag, monkeypatch):
    import tuner.measure.engine

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real_free_port = tuner.measure.engine.free_port
    ports = iter([taken])
    monkeypatch.setattr(tuner.measure.engine, "free_port",
                        lambda host="127.0.0.1": next(ports, None) or real_free_port(host))
    try:
        out = runner.measure_outcome(_spec(tag), TrialConfig(), _workload(n=3),
                                     MeasureSettings(), str(tmp_path))
    finally:
        holder.close()
    assert out.result is not None, out.failure
    log = (tmp_path / "engine.log").read_text()
    assert "address already in use" in log.lower()
    _, port = _engine_of(tmp_path / "engine.log")
    assert port != taken
    assert_nothing_left(tag, ports=(port,))


def test_a_failing_engine_fails_every_trial_and_the_study_still_ends(tmp_path, tag):
    spec = fake_engine_spec(env={MARK: tag}, tokenizer=str(EMBEDDED_TOKENIZER),
                            malformed_every=1)
    study = api.optimize(OptimizeOptions(
        strategy="optuna",  # the Optuna search under test
        workload=WorkloadSpec(name="instructcoder", num_prompts=2, output_len=8),
        engine=spec, space_name="ngram", settings=MeasureSettings(),
        out_dir=tmp_path / "study", study_name="s", n_trials=3,
        objectives=["output_throughput"], target_concurrency=1, constraints={}),
        say=lambda _m: None)
    trials = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 3
    assert {t.user_attrs["failure"]["kind"] for t in trials} == {"measurement_failed"}
    assert st.counted_trials(study) == 3
    assert_nothing_left(tag)


# --- the driver interrupted, then resumed -----------------------------------------------------
def _driver_cmd(out: Path, tag: str, n_trials: int = 3) -> list[str]:
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0})
    return [sys.executable, "-m", "tuner", "optimize", "--strategy", "optuna", "--model", str(EMBEDDED_TOKENIZER),
            "--vllm-cmd", f"{sys.executable} -m tuner.testing.fake_engine",
            f"--engine-args=--fake-script '{script}'", "--engine-env", f"{MARK}={tag}",
            "--space", "ngram", "--n-trials", str(n_trials), "--num-prompts", "2",
            "--output-len", "24", "--concurrency", "1", "--output-dir", str(out), "--no-report"]


def _wait_for(path: Path, text: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"'{text}' never appeared in {path}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_interrupted_driver_leaves_nothing_and_resumes(tmp_path, tag, sig):
    out = tmp_path / "study"
    proc = subprocess.Popen(_driver_cmd(out, tag), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=ctrl_c_delivered)
    log = out / "trials" / "1" / "engine.log"
    try:
        _wait_for(log, "Application startup complete")
        time.sleep(0.5)  # into trial 1's measurement
        os.kill(proc.pid, sig)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGINT:
        assert proc.returncode == 130, output
        assert "Traceback" not in output, output
        after = output.split("[1/", 1)[1].splitlines()[1:]
        # Trial 1's own progress lines (engine starting, ready) precede the interruption.
        assert [line for line in after if line.strip() and not line.startswith("  trial 1: ")
                ] == [INTERRUPTED], output
    else:
        assert proc.returncode == -signal.SIGKILL
    pid, port = _engine_of(log)
    assert_nothing_left(tag, pgids=(pid,), ports=(port,))

    before = st.open_existing(out)
    done = {t.number: t.values for t in before.trials
            if t.state == optuna.trial.TrialState.COMPLETE}
    interrupted = [t for t in before.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert list(done) == [0] and [t.number for t in interrupted] == [1]

    r = subprocess.run(_driver_cmd(out, tag), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "1 trial(s) interrupted by a dead driver will be retried" in r.stderr
    after = st.open_existing(out)
    for number, values in done.items():
        assert after.trials[number].values == values  # nothing measured is lost
    assert after.trials[1].user_attrs["failure"]["kind"] == "driver_died"
    assert any(t.params == interrupted[0].params and t.number > 1
               and t.state == optuna.trial.TrialState.COMPLETE for t in after.trials)
    assert not [t for t in after.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert st.counted_trials(after) == 3
    assert_nothing_left(tag)


# --- a Ray worker dies with its trial ---------------------------------------------------------
def test_a_dead_ray_worker_fails_its_trial_and_takes_its_engine_along(tmp_path, tag):
    pytest.importorskip("ray")
    import ray

    out = tmp_path / "study"
    killed: dict[str, int] = {}

    def kill_worker_of_trial_1() -> None:
        log = out / "trials" / "1" / "engine.log"
        _wait_for(log, "Application startup complete")
        time.sleep(0.5)
        pid, port = _engine_of(log)
        # The engine's parent is its watchdog (tuner/measure/watchdog.py), whose parent is the worker.
        watchdog = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        worker = int(Path(f"/proc/{watchdog}/stat").read_text().rsplit(")", 1)[1].split()[1])
        killed.update(engine=pid, port=port, worker=worker)
        os.kill(worker, signal.SIGKILL)

    killer = threading.Thread(target=kill_worker_of_trial_1, daemon=True)
    killer.start()
    spec = fake_engine_spec(env={MARK: tag}, tokenizer=str(EMBEDDED_TOKENIZER), tpot_ms=40)
    try:
        study = api.optimize(OptimizeOptions(
            strategy="optuna",  # the Optuna search under test
            workload=WorkloadSpec(name="instructcoder", num_prompts=2, output_len=24),
            engine=spec, space_name="ngram", settings=MeasureSettings(),
            out_dir=out, study_name="ray", n_trials=3, objectives=["output_throughput"],
            target_concurrency=1, constraints={}, logical_gpus=1, gpus_per_trial=1),
            say=lambda _m: None)
    finally:
        ray.shutdown()
    killer.join(timeout=5)
    assert killed, "the Ray worker was never killed: the test exercised nothing"
    failure = study.trials[1].user_attrs["failure"]
    assert failure["kind"] == "worker_died", failure
    assert study.trials[1].state == optuna.trial.TrialState.FAIL
    assert st.counted_trials(study) == 3  # the study went on after the dead worker
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 2
    assert_nothing_left(tag, pgids=(killed["engine"],), ports=(killed["port"],))
