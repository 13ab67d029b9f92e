"""Storage faults with real processes and a real small disk (fake engine): two drivers on one
study, a lock whose holder was killed, a disk that fills while the journal is appended, a torn
journal resumed by the same command, and heartbeats in a shared database."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tuner import cli
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.storage import STUDY_ATTR
from tuner.search import outcomes, storage
from tuner.search import study as st
from tuner.search.space import Point


def _driver_cmd(out: Path, n_trials: int, *, tpot_ms: float = 2) -> list[str]:
    script = json.dumps({"ttft_ms": 5, "tpot_ms": tpot_ms, "startup_s": 0})
    return [sys.executable, "-m", "tuner", "optimize", "--strategy", "optuna", "--model", str(EMBEDDED_TOKENIZER),
            "--vllm-cmd", f"{sys.executable} -m tuner.testing.fake_engine",
            f"--engine-args=--fake-script '{script}'", "--space", "ngram",
            "--n-trials", str(n_trials), "--num-prompts", "2", "--output-len", "24",
            "--concurrency", "1", "--output-dir", str(out), "--no-report"]


def _holder_pid(out: Path, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(json.loads((out / storage.LOCK).read_text())["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise AssertionError(f"no lock holder recorded in {out}")


def _completed(out: Path) -> dict[int, list[float]]:
    return {t.number: t.values for t in st.open_existing(out).trials
            if t.state == optuna.trial.TrialState.COMPLETE}


def test_second_driver_exits_2_naming_the_first_which_finishes_untouched(tmp_path):
    out = tmp_path / "study"
    first = subprocess.Popen(_driver_cmd(out, 3, tpot_ms=40), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert _holder_pid(out) == first.pid
        for second in (_driver_cmd(out, 3), [sys.executable, "-m", "tuner", "policy", str(out)]):
            r = subprocess.run(second, capture_output=True, text=True, timeout=120)
            assert r.returncode == 2, r.stderr
            assert f"is in use by tuner pid {first.pid} on host" in r.stderr
            assert "Traceback" not in r.stderr
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    study = st.open_existing(out)
    assert st.counted_trials(study) == 3
    assert not [t for t in study.trials if t.user_attrs.get("failure", {}).get("kind")
                == "driver_died"], "the second driver must not touch the first's trials"


def test_lock_of_a_killed_holder_is_taken_over_in_one_line(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from tuner.search import storage\nwith storage.driver():\n"
         "    storage.open_journal(Path(sys.argv[1]), write=True)\n    time.sleep(120)\n",
         str(tmp_path)])
    try:
        assert _holder_pid(tmp_path) == holder.pid
        r = subprocess.run([sys.executable, "-m", "tuner", "repair", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and f"in use by tuner pid {holder.pid}" in r.stderr, r.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    r = subprocess.run([sys.executable, "-m", "tuner", "repair", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("took over the lock") == 1
    assert f"tuner pid {holder.pid}" in r.stderr and "nothing to repair" in r.stdout


def test_torn_journal_resumes_with_the_same_command(tmp_path):
    out = tmp_path / "study"
    assert subprocess.run(_driver_cmd(out, 2), capture_output=True, timeout=300).returncode == 0
    journal = out / storage.JOURNAL
    os.truncate(journal, journal.stat().st_size - 40)  # `truncate -s -40 study.journal`
    before = _completed(out)
    r = subprocess.run(_driver_cmd(out, 3), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (side,) = out.glob("study.journal.torn-*")
    torn = [ln for ln in r.stderr.splitlines() if "the last line was torn" in ln]
    assert len(torn) == 1 and side.name in torn[0]
    after = st.open_existing(out)
    for number, values in before.items():
        assert after.trials[number].values == values
    assert st.counted_trials(after) == 3
    assert storage.scan(journal).tail == b"" and not storage.scan(journal).bad


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (needs root to mount); unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                                            str(disk)], capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root; the monkeypatched test covers ENOSPC")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_disk_full_during_a_study_is_one_message_and_the_same_command_resumes(tmp_path,
                                                                               small_disk):
    out = small_disk / "study"
    out.mkdir()
    # Trial folders go to the big disk, so the journal itself is what fills the small one.
    (tmp_path / "trials").mkdir()
    (out / "trials").symlink_to(tmp_path / "trials")
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 40_000)
    r = subprocess.run(_driver_cmd(out, 12), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tuner: error: No space left on device writing "
                           f"{out / storage.JOURNAL}. Free space or use --output-dir"), last
    before = _completed(out)  # everything finished is readable on the full disk
    assert before
    filler.unlink()
    n = st.counted_trials(st.open_existing(out)) + 1
    r = subprocess.run(_driver_cmd(out, n), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    if list(out.glob("study.journal.torn-*")):
        assert "the last line was torn" in r.stderr
    after = st.open_existing(out)
    for number, values in before.items():
        assert after.trials[number].values == values
    assert st.counted_trials(after) == n


def test_disk_full_while_appending_is_one_message_and_exit_2(tmp_path, capsys, monkeypatch):
    from optuna.storages.journal import JournalFileBackend

    def full(self, logs):
        raise OSError(errno.ENOSPC, "No space left on device")  # as f.write raises it

    monkeypatch.setattr(JournalFileBackend, "append_logs", full)
    out = tmp_path / "study"
    code = cli.main(["optimize", "--strategy", "optuna", "--model", str(EMBEDDED_TOKENIZER), "--space", "ngram",
                     "--num-prompts", "2", "--output-len", "8", "--output-dir", str(out),
                     "--no-report"])
    err = capsys.readouterr().err
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"tuner: error: No space left on device writing {out / 'study.journal'}")
    assert "--output-dir" in line and "the same command resumes" in line
    assert "Traceback" not in err


def test_shared_database_fails_only_trials_whose_heartbeat_went_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "HEARTBEAT_INTERVAL_S", 1)
    monkeypatch.setattr(storage, "HEARTBEAT_GRACE_S", 2)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    dead = optuna.create_study(study_name="s", storage=st.storage(tmp_path, url))
    dead.set_user_attr(STUDY_ATTR, {"objectives": ["output_throughput"]})
    orphan = dead.ask({"method": optuna.distributions.CategoricalDistribution(["ngram"]),
                       "ngram.k": optuna.distributions.IntDistribution(1, 8)})
    rdb = dead._storage._backend  # under Optuna's _CachedStorage
    with rdb._beats_lock:
        rdb._mine.clear()  # its driver dies: no more beats
    live = optuna.load_study(study_name="s", storage=st.storage(tmp_path, url))
    running = live.ask({"k": optuna.distributions.IntDistribution(1, 8)})
    time.sleep(3.5)
    retry = outcomes.recover_orphans(live)
    states = {t.number: t.state.name for t in live.get_trials(deepcopy=False)}
    assert states == {orphan.number: "FAIL", running.number: "RUNNING"}
    assert retry == [Point(method="ngram", values=(("k", orphan.params["ngram.k"]),))]
    failed = live.trials[orphan.number]
    assert failed.user_attrs["failure"]["kind"] == "driver_died"
    # It stayed RUNNING because it was beating: once its beats stop, it goes stale too.
    live_rdb = live._storage._backend
    assert live_rdb._get_stale_trial_ids(live._study_id) == []
    with live_rdb._beats_lock:
        live_rdb._mine.clear()
    time.sleep(3.5)
    assert live_rdb._get_stale_trial_ids(live._study_id) == [running._trial_id]
