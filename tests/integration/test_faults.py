"""The fault drill: every fault a study must survive, injected, and after each the proof that
it ended as data (a FAIL trial with its reason, or errored records counted in a level), that
no trial was lost and that nothing was left behind.

Most faults run on the scripted fake engine (seconds each); those about the engine itself run
again on the real vLLM CPU engine with the embedded model (marked `engine`, as every test that
starts vLLM: about a minute each). Every engine these tests start carries a marker in its
environment, so "nothing left behind" means: no live process with that marker, none in the
engine's process group or session, and nothing listening on the engine's port.

Each fault is one row of the drill's table, printed after the session's summary whatever
order the faults ran in (tests/conftest.py `terminal_summary`; `pytest -s` not needed); a
fault that fails fails its own test. `.venv/bin/python -m pytest tests/integration/
test_faults.py` runs the whole drill, `-m "not engine"` the fake engine's part only, `-k NAME`
one fault. Faults drilled in other files are named under the table.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from conftest import ctrl_c_delivered, fake_engine_spec, terminal_summary

from tuner import api
from tuner.api import engines
from tuner.errors import EngineStartTimeout
from tuner.measure import launcher
from tuner.measure import trial as runner
from tuner.measure.engine import TEARDOWN_GRACE_S, Engine
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, Prompt, TrialConfig, Workload, WorkloadSpec
from tuner.records.options import EngineOptions, OptimizeOptions
from tuner.search import storage
from tuner.search import study as st
from tuner.testing import leaks

MARK = "TUNER_FAULT_TEST"
INTERRUPTED = "tuner: interrupted; engines were stopped, finished results are kept."
BAD_WINDOW = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
              "prompt_lookup_max": 2}
VLLM_REASON = "prompt_lookup_min=5 must be <= prompt_lookup_max=2"
ROOT = Path(__file__).resolve().parents[2]


# --- the drill's table: one row per fault run in this session ----------------------------------
@dataclass
class Row:
    fault: str
    engine: str
    expected: str
    observed: str = "(the fault did not get that far)"
    lost: int = 0
    leftover: int = 0
    result: str = "FAIL"  # PASS once the fault's block ends without an exception; SKIP
    seconds: float = 0.0

    def nothing_left(self, tag: str, *, pgids: tuple[int, ...] = (),
                     ports: tuple[int, ...] = (), wait_s: float = 10.0) -> None:
        """A killed driver's watchdog needs a moment to tear the engine tree down: allow for
        it. This driver's launchers (tuner/measure/launcher.py: the real engine's fast start)
        carry the marker too, idle, and stop with the driver (tests/integration/
        test_launcher.py): stopped first, so that what is left is what the fault left."""
        launcher.close_all()
        left = leaks.leftovers(MARK, tag, pgids=pgids, ports=ports, wait_s=wait_s)
        self.leftover = len(left)
        assert not left, f"engine processes survived: {left}"

    def nothing_lost(self, lost: int) -> None:
        self.lost = lost
        assert lost == 0, f"{lost} trial(s) lost"


DRILL: list[Row] = []
# Faults of the drill whose tests live beside the code they exercise.
ELSEWHERE = {
    "test_storage_faults.py": "torn journal tail, two drivers on one study, disk full during "
                              "a study, a killed lock holder",
    "test_watchdog.py": "driver SIGKILL (fake engine tree and real vLLM), double Ctrl-C on a "
                        "slow fake engine",
    "test_search_waste.py": "rejected config proposed again, every trial failed",
}


@contextlib.contextmanager
def drill(fault: str, engine: str, expected: str) -> Iterator[Row]:
    """One fault: its row is PASS only when the block ends without a failed assertion."""
    row = Row(fault, engine, expected)
    DRILL.append(row)
    t0 = time.monotonic()
    try:
        yield row
        row.result = "PASS"
    except pytest.skip.Exception:
        row.result = "SKIP"
        raise
    finally:
        row.seconds = time.monotonic() - t0


@pytest.fixture(autouse=True, scope="module")
def _drill_table(pytestconfig: pytest.Config) -> None:
    """The drill's table, printed once the session ends, in whatever order the faults ran."""
    terminal_summary(pytestconfig, "fault drill", drill_report)


def drill_report() -> str:
    """The drill's table of the faults run in this session, and the faults drilled elsewhere."""
    if not DRILL:
        return ""
    passed = sum(r.result == "PASS" for r in DRILL)
    more = "\n".join(f"  {name}: {what}" for name, what in ELSEWHERE.items())
    return (f"fault drill: {passed}/{len(DRILL)} faults passed in "
            f"{sum(r.seconds for r in DRILL):.0f} s\n{table(DRILL)}\n\nalso drilled, in tests/"
            f"integration/:\n{more}")


def table(rows: list[Row]) -> str:
    head = ["fault", "engine", "expected", "observed", "lost", "leftover", "result", "time"]
    width = [max(len(head[0]), *(len(r.fault) for r in rows)), 6,
             max(len(head[2]), *(len(r.expected) for r in rows)), 60, 4, 8, 6, 6]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, width, strict=True)),
             "  ".join("-" * w for w in width)]
    for r in rows:
        observed = textwrap.wrap(r.observed, width[3]) or [""]
        cells = [r.fault, r.engine, r.expected, observed[0], str(r.lost), str(r.leftover),
                 r.result, f"{r.seconds:.0f} s"]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, width, strict=True)).rstrip())
        pad = " " * (sum(width[:3]) + 6)
        lines += [pad + more for more in observed[1:]]
    return "\n".join(lines)


def short(text: str, n: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


# --- helpers ---------------------------------------------------------------------------------
def _marked(tag: str) -> list[str]:
    """Live (non-zombie) processes whose environment carries MARK=tag, as "pid N: cmdline"."""
    return leaks.marked_processes(MARK, tag)


def _engine_of(log: Path) -> tuple[int, int]:
    """(pid, port) of the engine that wrote `log` (the last start in it)."""
    found = leaks.engine_of(log)
    assert found is not None, f"no engine start in {log}"
    return found


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


def _recorded(out) -> int:
    """Trials lost by one measure_outcome: 0 when it came back as a result or a failure."""
    return 0 if (out.result is not None or out.failure is not None) else 1


def _study_lost(study, n_trials: int) -> int:
    running = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
    return running + max(0, n_trials - st.counted_trials(study))


# --- engine faults, one trial each ------------------------------------------------------------
def test_engine_exiting_at_start_up_is_a_failure_with_vllms_reason(tmp_path, tag):
    _exits_at_start_up(_spec(tag, child_process=True), "fake", tmp_path, tag)


def _exits_at_start_up(spec, where: str, tmp_path, tag) -> None:
    """A min>max window launched on `spec`: the engine dies while starting, and the trial is
    a FAIL in vLLM's words with nothing lost or left behind."""
    with drill("exits at start-up (min>max window)", where,
               "EngineCrashed, vLLM's reason") as row:
        out = runner.measure_outcome(spec, TrialConfig(speculative_config=BAD_WINDOW),
                                     _workload(), MeasureSettings(), str(tmp_path))
        f = out.failure
        row.observed = f"{f.kind}: {short(f.reason.rsplit(': ', 1)[-1], 70)}" if f else "measured"
        row.nothing_lost(_recorded(out))
        assert f.kind == "engine_crashed"
        assert VLLM_REASON in f.reason
        row.nothing_left(tag)


def test_engine_dying_mid_measurement_is_engine_died(tmp_path, tag):
    with drill("dies mid-measurement", "fake", "EngineDied -> FAIL trial") as row:
        spec = _spec(tag, child_process=True, die_after_requests=4, tpot_ms=5)
        out = runner.measure_outcome(spec, TrialConfig(), _workload(output_len=20),
                                     MeasureSettings(num_requests=12), str(tmp_path))
        f = out.failure
        row.observed = f"{f.kind}: {short(f.reason)}" if f else "measured: no failure!"
        row.nothing_lost(_recorded(out))
        assert f.kind == "engine_died"
        assert "vLLM exited during the c=1 level" in f.reason
        assert "scripted die_after_requests" in f.log_tail
        pid, port = _engine_of(tmp_path / "engine.log")
        row.nothing_left(tag, pgids=(pid,), ports=(port,))


def test_engine_hanging_before_health_is_a_start_timeout(tmp_path, tag):
    with drill("hangs before /health", "fake", "EngineStartTimeout, reaped") as row:
        out = runner.measure_outcome(_spec(tag, hang_before_health=True, ready_timeout_s=1.0),
                                     TrialConfig(), _workload(), MeasureSettings(),
                                     str(tmp_path))
        row.observed = f"{out.failure.kind}: {short(out.failure.reason, 60)}"
        row.nothing_lost(_recorded(out))
        assert out.failure.kind == "engine_start_timeout"
        assert "did not answer /health within 1 s" in out.failure.reason
        row.nothing_left(tag)


def test_a_stopped_engine_group_is_reaped_without_waiting_out_the_grace(tmp_path, tag):
    """SIGSTOP (a hang vLLM cannot produce on demand): SIGTERM stays pending in a stopped
    process, so teardown must SIGCONT it rather than wait TEARDOWN_GRACE_S for nothing."""
    with drill("hangs before /health (SIGSTOP)", "fake", "EngineStartTimeout, reaped at once"
               ) as row:
        spec = _spec(tag, hang_before_health=True, child_process=True, ready_timeout_s=3.0)
        eng = Engine(spec, TrialConfig(), log_path=tmp_path / "engine.log")
        stopped: list[int] = []

        def stop_group() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                proc = eng.proc
                # the fake and its child
                if proc is not None and len(leaks.group_members(proc.pid)) >= 2:
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
        row.observed = (f"engine_start_timeout; {'SIGSTOPped' if stopped else 'NEVER stopped'}"
                        f" group reaped {elapsed - 3.0:.1f} s after the 3 s limit")
        assert stopped, "the group was never stopped: the test exercised nothing"
        assert elapsed < 3.0 + TEARDOWN_GRACE_S / 2, \
            f"teardown of a stopped group took {elapsed:.0f} s"
        row.nothing_left(tag, pgids=(stopped[0],))


def test_stalled_requests_time_out_then_the_trial_fails(tmp_path, tag):
    with drill("/health ok, requests stall", "fake", "timeouts -> MeasurementFailed") as row:
        spec = _spec(tag, stall_requests=True, request_timeout_s=1.0)
        out = runner.measure_outcome(spec, TrialConfig(), _workload(n=3),
                                     MeasureSettings(num_requests=2), str(tmp_path))
        f = out.failure
        row.observed = f"{f.kind}: {short(f.reason)}" if f else "measured: no failure!"
        row.nothing_lost(_recorded(out))
        assert f.kind == "measurement_failed"
        assert "2 of 2 requests failed" in f.reason and "timed out after 1 s" in f.reason
        records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
        assert len(records) == 3 and all("timed out" in r["error"] for r in records)  # 1 warm-up
        pid, port = _engine_of(tmp_path / "engine.log")
        row.nothing_left(tag, pgids=(pid,), ports=(port,))


def test_a_level_past_its_timeout_fails_the_trial(tmp_path, tag):
    with drill("level past its timeout", "fake", "MeasurementFailed -> FAIL") as row:
        spec = _spec(tag, stall_requests=True, request_timeout_s=30.0, level_timeout_s=0.5)
        out = runner.measure_outcome(spec, TrialConfig(), _workload(n=3), MeasureSettings(),
                                     str(tmp_path))
        row.observed = f"{out.failure.kind}: {short(out.failure.reason)}"
        row.nothing_lost(_recorded(out))
        assert out.failure.kind == "measurement_failed"
        assert "did not finish within" in out.failure.reason
        row.nothing_left(tag)


def test_few_malformed_chunks_and_http_errors_are_counted_in_the_level(tmp_path, tag):
    with drill("malformed + HTTP 500, 13%", "fake", "errors counted, trial kept") as row:
        # Server-side request numbers 2..31 are measured (1 is the warm-up): 10, 20 malformed,
        # 15 and 30 HTTP 500 (30 is checked for the HTTP error first): 4 of 30, under 20 %.
        spec = _spec(tag, malformed_every=10, http_error_every=15)
        out = runner.measure_outcome(spec, TrialConfig(), _workload(n=31),
                                     MeasureSettings(num_requests=30), str(tmp_path))
        row.nothing_lost(_recorded(out))
        (level,) = out.result.levels
        row.observed = (f"trial measured; {level.failed}/{level.num_requests} errored records "
                        f"counted")
        assert (level.failed, level.completed, level.num_requests) == (4, 26, 30)
        assert any("malformed JSON chunk" in e for e in level.errors)
        assert any(e.startswith("HTTP 500") for e in level.errors)
        row.nothing_left(tag)


def test_many_malformed_chunks_and_http_errors_fail_the_trial(tmp_path, tag):
    with drill("malformed + HTTP 500, >20%", "fake", "MeasurementFailed -> FAIL") as row:
        spec = _spec(tag, malformed_every=2, http_error_every=3)
        out = runner.measure_outcome(spec, TrialConfig(), _workload(n=13),
                                     MeasureSettings(num_requests=12), str(tmp_path))
        f = out.failure
        row.observed = f"{f.kind}: {short(f.reason, 80)}" if f else "measured: no failure!"
        row.nothing_lost(_recorded(out))
        assert f.kind == "measurement_failed"
        assert re.search(r"c=1: \d+ of 12 requests failed", f.reason)
        failed = sum(1 for line in (tmp_path / "requests.jsonl").read_text().splitlines()
                     if json.loads(line)["error"] and not json.loads(line)["warmup"])
        assert failed > 0.2 * 12
        row.nothing_left(tag)


def test_a_port_taken_between_probe_and_bind_is_retried_on_another(tmp_path, tag, monkeypatch):
    import tuner.measure.engine

    with drill("port taken before bind", "fake", "retry on another port") as row:
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
        row.nothing_lost(_recorded(out))
        assert out.result is not None, out.failure
        log = (tmp_path / "engine.log").read_text()
        _, port = _engine_of(tmp_path / "engine.log")
        row.observed = (f"port {taken} held: "
                        f"{'address already in use' if 'address already in use' in log.lower() else 'no bind error'}"
                        f"; retried, measured on port {port}")
        assert "address already in use" in log.lower()
        assert port != taken
        row.nothing_left(tag, ports=(port,))


def test_a_failing_engine_fails_every_trial_and_the_study_still_ends(tmp_path, tag):
    with drill("every request malformed, 3 trials", "fake", "3 FAIL trials, study ends") as row:
        spec = fake_engine_spec(env={MARK: tag}, tokenizer=str(EMBEDDED_TOKENIZER),
                                malformed_every=1)
        study = api.optimize(OptimizeOptions(
            strategy="optuna",  # the Optuna search under test
            workload=WorkloadSpec(name="instructcoder", num_prompts=2, output_len=8),
            space_name="ngram", settings=MeasureSettings(),
            out_dir=tmp_path / "study", study_name="s", n_trials=3,
            objectives=["output_throughput"], target_concurrency=1, constraints={}), engine=spec,
            say=lambda _m: None)
        trials = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        kinds = sorted({t.user_attrs.get("failure", {}).get("kind", "-") for t in trials})
        row.observed = f"{len(trials)} trials finished, {', '.join(kinds)}"
        row.nothing_lost(_study_lost(study, 3))
        assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 3
        assert {t.user_attrs["failure"]["kind"] for t in trials} == {"measurement_failed"}
        assert st.counted_trials(study) == 3
        row.nothing_left(tag)


# --- the driver interrupted, then resumed -----------------------------------------------------
def _driver_cmd(out: Path, tag: str, n_trials: int = 3) -> list[str]:
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0})
    return [sys.executable, "-m", "tuner", "optimize", "--strategy", "optuna", "--model", str(EMBEDDED_TOKENIZER),
            "--vllm-cmd", f"{sys.executable} -m tuner.testing.fake_engine",
            f"--engine-args=--fake-script '{script}'", "--engine-env", f"{MARK}={tag}",
            "--space", "ngram", "--n-trials", str(n_trials), "--num-prompts", "2",
            "--output-len", "24", "--concurrency", "1", "--output-dir", str(out), "--no-report"]


def _tuner(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True,
                          text=True, timeout=timeout)


def _wait_for(path: Path, text: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"'{text}' never appeared in {path}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_interrupted_driver_leaves_nothing_and_resumes(tmp_path, tag, sig):
    expected = "exit 130, 1 line, resume" if sig == signal.SIGINT else "engine dies too, resume"
    with drill(f"driver {sig.name} mid-trial", "fake", expected) as row:
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
        row.observed = f"exit {proc.returncode}"
        if sig == signal.SIGINT:
            assert proc.returncode == 130, output
            assert "Traceback" not in output, output
            after = output.split("[1/", 1)[1].splitlines()[1:]
            # Trial 1's own progress lines (engine starting, ready) precede the interruption.
            assert [line for line in after if line.strip() and not line.startswith("  trial 1: ")
                    ] == [INTERRUPTED], output
            row.observed += ", the 1-line message, no traceback"
        else:
            assert proc.returncode == -signal.SIGKILL
        pid, port = _engine_of(log)
        row.nothing_left(tag, pgids=(pid,), ports=(port,))

        before = st.open_existing(out)
        done = {t.number: t.values for t in before.trials
                if t.state == optuna.trial.TrialState.COMPLETE}
        interrupted = [t for t in before.trials if t.state == optuna.trial.TrialState.RUNNING]
        assert list(done) == [0] and [t.number for t in interrupted] == [1]

        r = subprocess.run(_driver_cmd(out, tag), capture_output=True, text=True, timeout=300)
        after = st.open_existing(out)
        changed = sum(1 for n, v in done.items() if after.trials[n].values != v)
        row.observed += (f"; resume exit {r.returncode}: {len(done)} completed trial(s) "
                         f"{'intact' if not changed else 'CHANGED'}, trial 1 "
                         f"{after.trials[1].user_attrs.get('failure', {}).get('kind')}")
        assert r.returncode == 0, r.stderr
        assert "1 trial(s) interrupted by a dead driver will be retried" in r.stderr
        row.nothing_lost(changed + _study_lost(after, 3))  # nothing measured is lost
        assert after.trials[1].user_attrs["failure"]["kind"] == "driver_died"
        assert any(t.params == interrupted[0].params and t.number > 1
                   and t.state == optuna.trial.TrialState.COMPLETE for t in after.trials)
        assert not [t for t in after.trials if t.state == optuna.trial.TrialState.RUNNING]
        assert st.counted_trials(after) == 3
        row.nothing_left(tag)


# --- a Ray worker dies with its trial ---------------------------------------------------------
def test_a_dead_ray_worker_fails_its_trial_and_takes_its_engine_along(tmp_path, tag):
    pytest.importorskip("ray")
    import ray

    with drill("Ray worker killed mid-trial", "fake", "FAIL worker_died, goes on") as row:
        out = tmp_path / "study"
        killed: dict[str, int] = {}

        def kill_worker_of_trial_1() -> None:
            log = out / "trials" / "1" / "engine.log"
            _wait_for(log, "Application startup complete")
            time.sleep(0.5)
            pid, port = _engine_of(log)
            # The engine's parent is its watchdog (tuner/measure/watchdog.py), whose parent is
            # the worker.
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
                space_name="ngram", settings=MeasureSettings(),
                out_dir=out, study_name="ray", n_trials=3, objectives=["output_throughput"],
                target_concurrency=1, constraints={}, logical_gpus=1, gpus_per_trial=1), engine=spec,
                say=lambda _m: None)
        finally:
            ray.shutdown()
        killer.join(timeout=5)
        assert killed, "the Ray worker was never killed: the test exercised nothing"
        failure = study.trials[1].user_attrs.get("failure", {})
        row.observed = (f"trial 1 FAIL ({failure.get('kind')}); study went on, "
                        f"{st.counted_trials(study)}/3 trials recorded")
        assert failure["kind"] == "worker_died", failure
        assert study.trials[1].state == optuna.trial.TrialState.FAIL
        row.nothing_lost(_study_lost(study, 3))  # the study went on after the dead worker
        assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 2
        row.nothing_left(tag, pgids=(killed["engine"],), ports=(killed["port"],))


# --- the journal garbled in the middle: refused, repaired -------------------------------------
def _study_state(out: Path) -> dict[int, tuple]:
    return {t.number: (t.state.name, t.values, t.params)
            for t in st.open_existing(out).get_trials(deepcopy=False)}


def test_a_garbage_line_mid_journal_is_refused_by_line_then_repaired(tmp_path, tag):
    with drill("garbage line mid-journal", "fake", "exit 2 + line no.; repair") as row:
        out = tmp_path / "study"
        made = _tuner(*_driver_cmd(out, tag, 2)[3:])
        assert made.returncode == 0, made.stderr
        before = _study_state(out)
        journal = out / storage.JOURNAL
        lines = journal.read_bytes().splitlines(keepends=True)
        garbage = b"\x00\xff garbage \x81\n"
        journal.write_bytes(b"".join(lines[:6] + [garbage] + lines[6:]))
        refused = _tuner("report", str(out))
        fixed = _tuner("repair", str(out))
        again = _tuner("report", str(out))
        row.observed = (f"report exit {refused.returncode}, repair exit {fixed.returncode}, "
                        f"report again exit {again.returncode}")
        assert refused.returncode == 2, refused.stderr
        assert "line 7 of" in refused.stderr and f"tuner repair {out}" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert fixed.returncode == 0, fixed.stderr
        (quarantine,) = out.glob("study.journal.quarantine-*")
        assert quarantine.read_bytes() == garbage  # moved aside, never deleted
        assert re.search(r"moved 1 bad line\S* to \S+ beside it and kept \d+ records",
                         fixed.stdout), fixed.stdout
        assert again.returncode == 0, again.stderr
        assert journal.read_bytes() == b"".join(lines)
        after = _study_state(out)
        row.nothing_lost(sum(1 for n, v in before.items() if after.get(n) != v))
        row.observed += "; the bad line quarantined, every record kept"
        row.nothing_left(tag)


# --- bad inputs against an existing study: refused before anything starts ---------------------
_FULL_DISK = ("import errno, os, sys\ndef full(fd):\n    raise OSError(errno.ENOSPC, 'No space left "
              "on device')\nos.fsync = full\nfrom tuner import cli\nsys.exit(cli.main(sys.argv[1:]))"
              "\n")


def _tmpfs(path: Path, options: str, mounted: list[Path]) -> bool:
    """A small tmpfs at `path` (root only): a read-only or full disk made on demand."""
    path.mkdir(parents=True, exist_ok=True)
    ok = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True).returncode == 0
    if ok:
        mounted.append(path)
    return ok


def _bad_input_cases(work: Path, mounted: list[Path]) -> list[tuple[str, list[str], str]]:
    (work / "nan.yaml").write_text("methods:\n  ngram:\n    num_speculative_tokens: .nan\n")
    (work / "huge.yaml").write_text("methods:\n  ngram:\n    num_speculative_tokens: 3\n"
                                    "    prompt_lookup_max: 1e300\n")
    (work / "long.jsonl").write_text(json.dumps({"prompt": "x " * (9 << 20)}) + "\n")
    (work / "file").write_text("x")
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0})
    custom = ["--workload", "custom", "--dataset-path"]
    cases = [
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
    return cases


def test_bad_inputs_against_a_study_exit_2_in_one_line_and_leave_it_as_it_was(tmp_path, tag):
    """Each input tuner.checks refuses, typed against an existing study as a user would: exit
    2, one line, no traceback, no engine started, and the study's trials exactly as they were."""
    with drill("bad inputs (18 cases)", "fake", "exit 2, 1 line, study intact") as row:
        out = tmp_path / "study"
        made = _tuner(*_driver_cmd(out, tag, 2)[3:])
        assert made.returncode == 0, made.stderr
        before, trial_dirs = _study_state(out), sorted(os.listdir(out / "trials"))
        work = tmp_path / "files"
        work.mkdir()
        mounted: list[Path] = []
        failed = []
        try:
            cases = _bad_input_cases(work, mounted)
            assert len(cases) == 18
            for label, extra, fragment in cases:
                args = ["-q", *_driver_cmd(out, tag, 2)[3:], *extra]
                r = (subprocess.run([sys.executable, "-c", _FULL_DISK, *args],
                                    capture_output=True, text=True, timeout=300)
                     if label.endswith("(injected)") else _tuner(*args))
                lines = r.stderr.strip().splitlines()
                if not (r.returncode == 2 and len(lines) == 1
                        and lines[0].startswith("tuner: error: ") and fragment in lines[0]
                        and "Traceback" not in r.stderr):
                    failed.append(f"{label}: exit {r.returncode}, {len(lines)} lines: "
                                  f"{short(r.stderr.strip(), 160)}")
        finally:
            for path in reversed(mounted):
                subprocess.run(["umount", "-l", str(path)], check=False)
        after = _study_state(out)
        changed = (sum(1 for n, v in before.items() if after.get(n) != v)
                   + len(set(after) - set(before)))
        started = sorted(os.listdir(out / "trials")) != trial_dirs or bool(_marked(tag))
        row.observed = (f"{len(cases) - len(failed)}/{len(cases)} exit 2, 1 line, no traceback;"
                        f" study: {len(before)} trials {'CHANGED' if changed else 'intact'}, "
                        f"{'an engine started!' if started else 'no engine started'}")
        assert not failed, "\n".join(failed)
        row.nothing_lost(changed)
        assert not started, "a refused command started an engine"
        assert (work / "file").read_text() == "x"


# --- the real vLLM engine ---------------------------------------------------------------------
def _real_spec(tag: str, **fields):
    pytest.importorskip("vllm", reason="the vLLM CPU build is not installed (scripts/setup.sh)")
    spec = engines.resolve_engine(EngineOptions(ready_timeout_s=900.0, request_timeout_s=120.0,
                                                env={MARK: tag}))
    return spec.model_copy(update=fields)


def _real_workload(spec, num_prompts: int = 8) -> Workload:
    from tuner.measure import workloads

    return workloads.load(WorkloadSpec(name="instructcoder", num_prompts=num_prompts,
                                       output_len=48), tokenizer=spec.tokenizer or spec.model)


@pytest.mark.engine
def test_real_engine_exiting_at_start_up_is_a_failure_with_vllms_reason(tmp_path, tag):
    """tuner.checks refuses this config before a launch (test_real_engine.py); the runner under
    it must still turn an engine that dies while starting into a FAIL trial in vLLM's words."""
    _exits_at_start_up(_real_spec(tag), "real", tmp_path, tag)


@pytest.mark.engine
def test_real_engine_killed_mid_measurement_is_engine_died(tmp_path, tag):
    with drill("SIGKILL mid-measurement", "real", "EngineDied -> FAIL trial") as row:
        spec = _real_spec(tag)
        log = tmp_path / "engine.log"
        killed: dict[str, int] = {}
        done = threading.Event()

        def killer() -> None:
            # The first GET /metrics after start-up is the scrape between warm-up and level.
            if not leaks.wait_for(log, "GET /metrics", after="Application startup complete",
                                  timeout_s=900, stop=done):
                return
            time.sleep(3.0)
            pid_port = leaks.engine_of(log)
            if pid_port and not done.is_set():
                pgid = os.getpgid(pid_port[0])
                killed.update(pgid=pgid, port=pid_port[1],
                              members=len(leaks.group_members(pgid)))
                os.killpg(pgid, signal.SIGKILL)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            out = runner.measure_outcome(spec, TrialConfig(), _real_workload(spec),
                                         MeasureSettings(concurrencies=(1,), num_requests=6),
                                         str(tmp_path))
        finally:
            done.set()
        thread.join(timeout=5)
        f = out.failure
        row.observed = (f"{f.kind}: {short(f.reason)}" if f else "measured: no failure!") + (
            f" (killpg SIGKILL of {killed['members']} processes 3 s into the level)"
            if killed else " (the engine was never killed)")
        row.nothing_lost(_recorded(out))
        assert killed, "the engine was never killed: the test exercised nothing"
        assert f.kind == "engine_died"
        row.nothing_left(tag, pgids=(killed["pgid"],), ports=(killed["port"],))


@pytest.mark.engine
@pytest.mark.xfail(strict=False, reason=(
    "known open failure, not yet explained: in 2 of 4 full runs (CI 2026-12-07 and a local "
    "run at 23:08 UTC) the SIGSTOPped engine's teardown took 40-46 s, every wait of "
    "reap_group running out, though it passes alone and with its launcher warmed"))
def test_real_engine_stopped_before_health_is_a_start_timeout_reaped_at_once(tmp_path, tag):
    """SIGSTOP of vLLM's group the moment its leader has exec'd: a hang vLLM cannot produce on
    demand. The limit passes, and teardown SIGCONTs the group rather than wait out its grace."""
    with drill("hangs before /health (SIGSTOP)", "real", "EngineStartTimeout, reaped") as row:
        ready_s = 20.0
        spec = _real_spec(tag, ready_timeout_s=ready_s)
        stopped: dict[str, int] = {}
        done = threading.Event()

        def stopper() -> None:
            # The engine's leader carries the marker once exec'd (before, it is a copy of
            # us); it is a child of its watchdog, a child of this process's main thread.
            needle = f"{MARK}={tag}".encode()
            children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
            while not done.is_set():
                kids = children.read_text().split()
                for k in list(kids):
                    with contextlib.suppress(OSError):
                        kids += Path(f"/proc/{k}/task/{k}/children").read_text().split()
                for p in kids:
                    if int(p) in launcher.live_launchers():
                        continue  # forks the engine (the fast start): its child is the one
                    with contextlib.suppress(OSError):
                        # A launcher's fork carries the marker from birth: the engine's leader
                        # is the one that leads its own group.
                        if needle in Path(f"/proc/{p}/environ").read_bytes().split(b"\0") \
                                and os.getpgid(int(p)) == int(p):
                            pgid = os.getpgid(int(p))
                            os.killpg(pgid, signal.SIGSTOP)
                            stopped.update(pgid=pgid)
                            return
                time.sleep(0.005)

        # The launcher imports vLLM before the clock starts: on a loaded machine the import
        # alone can take most of the limit, and the engine forked near its end would be
        # stopped after teardown's SIGCONT (seen in CI: 45.9 s).
        _warm_launcher(spec, tmp_path)
        thread = threading.Thread(target=stopper, daemon=True)
        thread.start()
        t0 = time.monotonic()
        try:
            out = runner.measure_outcome(spec, TrialConfig(), _workload(), MeasureSettings(),
                                         str(tmp_path))
        finally:
            done.set()
        total_s = time.monotonic() - t0
        thread.join(timeout=5)
        reap_s = max(0.0, total_s - ready_s)
        kind = out.failure.kind if out.failure else "measured"
        row.observed = (f"{kind} after {ready_s:.0f} s; "
                        f"{'SIGSTOPped group' if stopped else 'group (never stopped!)'} "
                        f"reaped in about {reap_s:.1f} s")
        row.nothing_lost(_recorded(out))
        assert stopped, "the group was never stopped: the test exercised nothing"
        assert kind == "engine_start_timeout"
        assert reap_s < TEARDOWN_GRACE_S / 2, f"teardown took {reap_s:.1f} s: no SIGCONT?"
        row.nothing_left(tag, pgids=(stopped["pgid"],))


def _warm_launcher(spec, tmp_path: Path) -> None:
    """Start the launcher an engine of `spec` would be forked from, and wait for its import."""
    from tuner import engine_cmdline
    from tuner.measure import engine

    cmd, _ = engine.entry_point(spec)
    argv = engine_cmdline.engine_argv(spec.model_copy(update={"vllm_cmd": cmd}), TrialConfig(),
                                      port=0, api_key="unused")
    assert engine.fast_start_applies(spec, argv), "the engine would not be forked"
    with open(tmp_path / "launcher.log", "ab") as log:
        la = launcher.launcher_for(argv[2], {**os.environ, **spec.env}, log=log)
        assert la.wait_ready(timeout_s=600), "the launcher did not import vLLM in 600 s"


def _engine_processes(tag: str, log: Path) -> list[str]:
    """The watchdog, the engine and its children: marked processes other than the driver, and
    every live process of the engine's session (vLLM renames EngineCore with setproctitle,
    which overwrites /proc/PID/environ: no marker is seen there)."""
    found = [p for p in _marked(tag) if " -m tuner bench " not in p]
    sid = (leaks.engine_of(log) or (None,))[0]
    if sid is not None:
        found += [p for p in leaks.session_members(sid)
                  if p.split(":")[0] + ":" not in str(found)]
    return found


@pytest.mark.engine
def test_real_engine_double_ctrl_c_lets_the_teardown_finish(tmp_path, tag):
    """The second Ctrl-C follows the first as soon as vLLM logs that its shutdown began; the
    teardown still runs to its end, and the driver exits 130 with its one line."""
    pytest.importorskip("vllm", reason="the vLLM CPU build is not installed (scripts/setup.sh)")
    with drill("double Ctrl-C", "real", "teardown completes, exit 130") as row:
        out = tmp_path / "bench"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner", "bench", "--num-prompts", "2", "--output-len", "48",
             "--concurrency", "1", "--output-dir", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, MARK: tag}, preexec_fn=ctrl_c_delivered)
        log = out / "engine.log"
        try:
            assert leaks.wait_for(log, "Application startup complete", timeout_s=900), \
                "the engine never started"
            if leaks.wait_for(log, "POST /v1/", timeout_s=120):
                time.sleep(0.5)
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGINT)
            while time.monotonic() < t0 + 10 and "[shutdown]" not in log.read_text(
                    errors="replace").split("Application startup complete", 1)[-1]:
                time.sleep(0.002)
            alive = len(_engine_processes(tag, log))
            gap_s = time.monotonic() - t0
            os.kill(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=TEARDOWN_GRACE_S + 60)
            took_s = time.monotonic() - t0
            left_at_exit = _engine_processes(tag, log)  # no grace: gone when the line says so
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        one_line = bool(lines) and lines[-1] == INTERRUPTED
        by_watchdog = "its driver is gone" in log.read_text(errors="replace")
        row.observed = (f"2nd Ctrl-C {gap_s:.2f} s after the 1st, {alive} engine processes "
                        f"still running; exit {proc.returncode} after {took_s:.1f} s, "
                        f"{'the 1-line message' if one_line else 'NOT the message'}, "
                        f"{len(left_at_exit)} left at exit"
                        f"{', stopped only by the watchdog' if by_watchdog else ''}")
        assert alive > 0, "the engine was gone before the second Ctrl-C: nothing exercised"
        assert proc.returncode == 130, err
        assert one_line and "Traceback" not in err, err
        assert not left_at_exit, left_at_exit
        assert not by_watchdog, "the driver's teardown was cut short; the watchdog finished it"
        pid, port = _engine_of(log)
        row.nothing_left(tag, pgids=(pid,), ports=(port,))
