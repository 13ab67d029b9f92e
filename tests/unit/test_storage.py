"""tuner.search.storage: the journal check on open (torn tail quarantined by the lock holder only, bad
middle lines refused with their line number, `tuner repair`), the study lock, and studies the
tuner must refuse (another tool's, a half-written one) before writing anything there."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from study_fakes import fake_meta

from tuner import cli
from tuner.errors import ConfigError
from tuner.outputs import journal_repair
from tuner.records.storage import STUDY_ATTR
from tuner.search import repair, storage
from tuner.search import study as st

SETTINGS = fake_meta(workload="random")


def _make_study(folder: Path, *, n_trials: int = 4, attrs: dict | None = SETTINGS) -> Path:
    """A study written by plain Optuna into folder/study.journal; returns the journal path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / storage.JOURNAL
    study = optuna.create_study(study_name="s", direction="maximize",
                                storage=JournalStorage(JournalFileBackend(str(path))))
    if attrs is not None:
        study.set_user_attr(STUDY_ATTR, attrs)
    for i in range(n_trials):
        trial = study.ask()
        trial.suggest_int("k", 1, 8)
        trial.set_user_attr("result", {"n": i})
        study.tell(trial, float(i))
    return path


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _insert(path: Path, at: int, line: bytes) -> None:
    lines = _lines(path)
    path.write_bytes(b"".join(lines[:at] + [line] + lines[at:]))


def _completed(folder: Path) -> dict[int, list[float]]:
    study = st.open_existing(folder)
    return {t.number: t.values for t in study.trials if t.state.name == "COMPLETE"}


def test_torn_tail_is_quarantined_by_the_writer_and_the_study_appends_cleanly(tmp_path):
    path = _make_study(tmp_path)
    whole = path.read_bytes()
    complete = _lines(path)
    path.write_bytes(whole[:-40])  # `truncate -s -40 study.journal`
    torn = complete[-1][:-40]

    # A reader (tuner report beside a live driver) reads and never changes the file.
    assert len(_completed(tmp_path)) == 3
    assert path.read_bytes() == whole[:-40]

    said: list[str] = []
    with storage.driver(say=said.append):
        study = optuna.load_study(study_name="s", storage=st.storage(tmp_path, write=True))
        assert len(said) == 1 and "torn" in said[0]
        (side,) = tmp_path.glob("study.journal.torn-*")
        assert side.name in said[0]
        assert side.read_bytes() == torn
        assert path.read_bytes() == b"".join(complete[:-1])  # every complete record kept
        trial = study.ask()  # appends after the last complete record, not after the torn bytes
        trial.suggest_int("k", 1, 8)
        study.tell(trial, 9.0)
    assert storage.scan(path).bad == () and storage.scan(path).tail == b""
    done = _completed(tmp_path)
    assert done[4] == [9.0] and done[0] == [0.0] and len(done) == 4  # trial 3 lost only its end


def test_a_record_that_lost_only_its_newline_is_completed_not_moved(tmp_path):
    path = _make_study(tmp_path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    said: list[str] = []
    with storage.driver(say=said.append):
        st.storage(tmp_path, write=True)
    assert path.read_bytes() == whole
    assert "completed it" in said[0] and not list(tmp_path.glob("study.journal.torn-*"))
    assert len(_completed(tmp_path)) == 4


@pytest.mark.parametrize("bad, why", [
    (b"this is not json\n", "invalid JSON"),
    (b"\xff\xfe\x00\x81binary\x00\n", "not UTF-8"),
    (b'{"op_code": 99, "worker_id": "w"}\n', "replay rejects (AssertionError"),
    (b'{"op_code": 4, "worker_id": "w"}\n', "replay rejects (KeyError"),
    (b"[1, 2, 3]\n", "not a journal record"),
])
def test_bad_middle_line_is_refused_with_its_number_then_repaired(tmp_path, bad, why):
    path = _make_study(tmp_path)
    good = path.read_bytes()
    _insert(path, 5, bad)
    corrupt = path.read_bytes()
    for write in (False, True):
        with storage.driver(say=lambda _m: None), pytest.raises(ConfigError) as e:
            st.storage(tmp_path, write=write)
        msg = str(e.value)
        assert f"line 6 of {len(_lines(path))}" in msg and why in msg
        assert f"tuner repair {tmp_path}" in msg
    assert path.read_bytes() == corrupt  # refused, unchanged

    with storage.driver(say=lambda _m: None):
        done = repair.repair(tmp_path)
    said = journal_repair.repair_text(done)
    assert [n.line for n in done.lines] == [6] and done.studies[0][1] == 4
    (quarantine,) = tmp_path.glob("study.journal.quarantine-*")
    assert quarantine.read_bytes() == bad  # moved, never deleted
    assert path.read_bytes() == good  # every good record kept
    assert "line 6" in said and "with 4 trials" in said
    assert len(_completed(tmp_path)) == 4


def test_repair_keeps_the_record_glued_to_a_torn_line(tmp_path):
    # What happened before this check: Optuna appended the next record right after a torn
    # line, leaving one merged invalid line in the middle; every command then died.
    path = _make_study(tmp_path)
    lines = _lines(path)
    merged = lines[-2][:-30] + lines[-1]
    path.write_bytes(b"".join(lines[:-2] + [merged] + [b'{"op_code": 2, "worker_id": "w", '
                                                       b'"study_id": 0, "user_attr": {"x": 1}}\n']))
    with pytest.raises(ConfigError, match=f"line {len(lines) - 1} of {len(lines)}"):
        st.open_existing(tmp_path)
    with storage.driver(say=lambda _m: None):
        done = repair.repair(tmp_path)
    assert [n.salvaged for n in done.lines] == [True]
    assert "1 recovered from torn lines" in journal_repair.repair_text(done)
    (quarantine,) = tmp_path.glob("study.journal.quarantine-*")
    assert quarantine.read_bytes() == lines[-2][:-30] + b"\n"
    study = st.open_existing(tmp_path)
    assert study.user_attrs["x"] == 1
    # The last trial's completion (the glued record) survived; only its torn attr went.
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4


def test_reader_leaves_an_unterminated_tail_alone_but_refuses_a_finished_bad_line(tmp_path):
    path = _make_study(tmp_path)
    path.write_bytes(path.read_bytes() + b'{"op_code": 8, "worker_id"')  # a write in progress
    before = path.read_bytes()
    assert len(_completed(tmp_path)) == 4 and path.read_bytes() == before
    path.write_bytes(before + b"\xff garbage\n")
    with pytest.raises(ConfigError, match="tuner repair"):
        st.open_existing(tmp_path)


def test_writing_needs_the_driver_lock(tmp_path):
    _make_study(tmp_path)
    with pytest.raises(RuntimeError, match="study lock"):
        st.storage(tmp_path, write=True)


def test_lock_records_its_holder_and_is_empty_once_released(tmp_path):
    with storage.driver(say=lambda _m: None):
        st.storage(tmp_path, write=True)
        holder = json.loads((tmp_path / storage.LOCK).read_text())
        assert holder["pid"] > 0 and holder["host"] and holder["since"].endswith("Z")
        st.storage(tmp_path, write=True)  # the same driver opens it again: no self-deadlock
    assert (tmp_path / storage.LOCK).read_text() == ""


def test_lock_left_by_a_dead_holder_is_taken_over_in_one_line(tmp_path):
    (tmp_path / storage.LOCK).write_text(json.dumps(
        {"pid": 999999, "host": "h1", "since": "2026-12-03T08:01:02Z"}))
    said: list[str] = []
    with storage.driver(say=said.append):
        st.storage(tmp_path, write=True)
    assert said == [f"Study {tmp_path}: took over the lock of tuner pid 999999 on host h1 "
                    f"(since 2026-12-03T08:01:02Z), which stopped without releasing it."]


def test_the_lock_holder_is_read_from_its_line_and_a_blank_lock_names_none():
    holder = storage._Holder(pid=7, host="h1", since="2026-12-03T08:01:02Z", argv=("tuner",))
    assert storage._Holder.parse(holder.line()) == holder
    assert storage._Holder.parse(b'{"pid": "7", "host": 3}') == storage._Holder()
    assert [storage._Holder.parse(b) for b in (b"", b"{}", b"[1]", b'{"pid": 7')] == [None] * 4
    assert "in use by another tuner process" in str(storage._in_use(Path("s"), None))


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("command", ["report", "recommend", "policy", "verify"])
def test_another_tools_study_is_refused_before_anything_is_written(tmp_path, capsys, command):
    _make_study(tmp_path, attrs=None)
    before = _listing(tmp_path)
    assert cli.main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a spec-tuner study" in err and "Traceback" not in err
    assert _listing(tmp_path) == before  # no report.html, trials.csv, study.lock ...


@pytest.mark.parametrize("command", ["policy", "verify"])
def test_policy_on_a_half_written_study_says_run_optimize_first(tmp_path, capsys, command):
    _make_study(tmp_path, n_trials=0, attrs={"objectives": ["output_throughput"]})
    before = _listing(tmp_path)
    assert cli.main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "has no finished setup" in err and "engine_spec" in err
    assert "tuner optimize" in err and "KeyError" not in err
    assert _listing(tmp_path) == before


def test_repair_command_prints_what_it_did(tmp_path, capsys):
    path = _make_study(tmp_path)
    _insert(path, 3, b"garbage\n")
    assert cli.main(["repair", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "moved 1 bad line(s)" in out and "line 4: invalid JSON" in out
    assert cli.main(["report", str(tmp_path)]) == 0


def test_a_database_storage_without_sqlalchemy_is_one_message(monkeypatch, tmp_path):
    # The offline GPU bundle leaves SQLAlchemy out unless --with-rdb: --storage URL says so.
    monkeypatch.setitem(__import__("sys").modules, "sqlalchemy", None)
    with pytest.raises(ConfigError) as e:
        storage.open_rdb(f"sqlite:///{tmp_path}/study.db")
    assert "needs sqlalchemy, which is not installed" in str(e.value)
    assert "--with-rdb" in str(e.value) and "leave --storage out" in str(e.value)
    assert str(tmp_path) not in str(e.value)  # the URL may hold a password: scheme only
