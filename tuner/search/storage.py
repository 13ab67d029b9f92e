"""Study storage: what is stored is never lost, and only one driver writes a study.

Promises: the journal (`study.journal`, Optuna's JournalFileBackend) is checked on every open:
readers only read (a partial last line may be a live driver's write in progress, and Optuna
skips it), while the driver that holds the study lock moves a torn last line into a side file
beside the journal (`study.journal.torn-<UTC time>`), truncates the journal to its last complete
record and says so in one line. A bad line in the middle is refused with its line number and the
command that repairs it (`tuner repair`), which moves bad lines into a quarantine file and keeps
every good record; nothing is ever deleted silently. One driver per study folder: an exclusive
flock on `study.lock` held for the whole driver call, recording pid, host and start time; the
kernel drops it when the holder dies, and the next driver takes it over. A database given as
`--storage` is shared by hosts, so there heartbeats tell a dead driver's trials from live ones.
OS errors while writing name the file, so the CLI can say which disk is full.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import ConfigError
from tuner.search import optuna_compat

JOURNAL = "study.journal"
LOCK = "study.lock"
# Optuna's own mutex around each append (JournalFileSymlinkLock): a driver killed inside an
# append leaves it behind, and Optuna would wait 30 s before breaking it.
JOURNAL_MUTEX = JOURNAL + ".lock"
HEARTBEAT_INTERVAL_S = 30
HEARTBEAT_GRACE_S = 120  # a trial whose driver missed four beats is a dead driver's

Say = Callable[[str], None]


# --- journal check -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Scan:
    """What a read of the journal found. Line numbers count from 1."""

    records: int  # complete records Optuna's replay accepts
    bad: tuple[tuple[int, str], ...]  # (line, why) of bad lines before the tail
    tail: bytes = b""  # an unterminated last line, or a last line that is not JSON
    tail_line: int = 0
    tail_is_record: bool = False  # the tail is a whole record that lost only its newline
    tail_start: int = 0  # byte offset of the tail: the journal up to here is good
    tail_why: str = ""


class _Feed(BaseJournalBackend):
    """A journal backend that hands Optuna's JournalStorage one record at a time, each once, and
    notes whether its replay came back for the next one (then the record went through)."""

    def __init__(self) -> None:
        self.record: dict[str, Any] | None = None
        self.applied = False

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        record, self.record = self.record, None
        if record is not None:
            yield record
            self.applied = True

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise RuntimeError("the journal check only reads")


class Replay:
    """Optuna's own journal replay (a JournalStorage), one record at a time, so a record it
    would choke on (a bad op code, a missing field, a wrong type) is found here with its line
    number, not as an AssertionError or KeyError traceback from inside Optuna."""

    _NO_STUDY = "\0"  # a study name no record makes: the lookup that makes the storage read

    def __init__(self) -> None:
        self._feed = _Feed()
        self._storage = JournalStorage(self._feed)

    def accepts(self, line: bytes) -> str | None:
        """None if the line is a record Optuna replays, else why not."""
        try:
            line.decode("utf-8")  # Optuna writes ASCII; anything else is damage
            # json.loads on bytes, as Optuna's reader does (same encoding detection).
            record = json.loads(line)
        except UnicodeDecodeError:
            return "not UTF-8 text"
        except ValueError as e:
            return f"invalid JSON ({e})"
        if not isinstance(record, dict) or "op_code" not in record:
            return "JSON but not a journal record (no op_code)"
        self._feed.record, self._feed.applied = record, False
        try:
            self._storage.get_study_id_from_name(self._NO_STUDY)
        except Exception as e:  # whatever Optuna's replay raises, it would raise on open too
            if not self._feed.applied:
                return f"a record Optuna's replay rejects ({type(e).__name__}: {str(e)[:80]})"
        return None


def journal_lines(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, line with its b"\\n") as Optuna's reader splits them."""
    start, number = 0, 1
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end + 1
        yield number, start, data[start:end]
        start, number = end, number + 1


def scan(path: Path) -> Scan:
    """Read the journal and classify every line; reads only."""
    data = path.read_bytes()
    replay = Replay()
    records, bad = 0, []
    lines = list(journal_lines(data))
    for i, (number, offset, line) in enumerate(lines):
        last = i == len(lines) - 1
        why = replay.accepts(line)
        if last and not line.endswith(b"\n"):
            return Scan(records, tuple(bad), tail=line, tail_line=number,
                        tail_is_record=why is None, tail_start=offset)
        if last and why is not None and why.startswith(("invalid JSON", "not UTF-8")):
            return Scan(records, tuple(bad), tail=line, tail_line=number, tail_start=offset,
                        tail_why=why)
        if why is None:
            records += 1
        else:
            bad.append((number, why))
    return Scan(records, tuple(bad), tail_start=len(data))


def _bad_lines(path: Path, bad: list[tuple[int, str]] | tuple[tuple[int, str], ...],
               total: int) -> ConfigError:
    """The error that refuses a journal with bad lines, naming the first and what to do."""
    (number, why), more = bad[0], len(bad) - 1
    also = f" (and {more} more bad line{'s' if more > 1 else ''})" if more else ""
    return ConfigError(
        f"{path} line {number} of {total} is {why}{also}; the study cannot be read past it. "
        f"Run `tuner repair {path.parent}` to move the bad line(s) into a quarantine file "
        f"beside the journal and keep every good record.")


# --- opening -----------------------------------------------------------------------------------
class _Backend(JournalFileBackend):
    """Optuna's journal file, with the path in OS errors: a full disk names the file."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        try:
            super().append_logs(logs)
        except OSError as e:
            if e.filename:
                raise
            raise OSError(e.errno, e.strerror, self.path) from e


def open_journal(study_dir: Path, *, write: bool = False) -> JournalStorage:
    """The study folder's journal storage, checked. `write`: this driver writes the study, so
    it takes the study lock first (a ConfigError names the holder) and repairs a torn tail."""
    path = study_dir / JOURNAL
    say = take_lock(study_dir) if write else None
    if path.exists():
        found = scan(path)
        total = found.records + len(found.bad) + (1 if found.tail else 0)
        if found.bad:
            raise _bad_lines(path, found.bad, total)
        if found.tail and say is not None:
            say(_mend_tail(path, found))
        elif found.tail.endswith(b"\n"):
            # A complete line that is not JSON is no write in progress; Optuna would stop on it
            # if it is not UTF-8. Only the lock holder may change the file.
            raise _bad_lines(path, [(found.tail_line, found.tail_why)], total)
    if say is not None:
        clear_stale_mutex(path)
    return JournalStorage(_Backend(str(path)))


def _utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def side_file(journal: Path, kind: str, data: bytes) -> Path:
    """Write `data` to a new file beside the journal (never over an existing one), durably."""
    stamp = _utc_stamp()
    for n in range(100):
        side = journal.with_name(f"{journal.name}.{kind}-{stamp}" + (f".{n}" if n else ""))
        try:
            fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        try:
            os.write(fd, data)
            os.fsync(fd)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(side)) from e
        finally:
            os.close(fd)
        fsync_dir(journal.parent)
        return side
    raise FileExistsError(f"{journal}.{kind}-{stamp}: 100 side files in one second")


def _mend_tail(path: Path, found: Scan) -> str:
    """Make the journal end with its last complete record; returns the line to show."""
    if found.tail_is_record:  # only the newline is missing: the record is whole, keep it
        with open(path, "ab") as f:
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
        return (f"{path}: line {found.tail_line} had lost its line ending (an interrupted "
                f"write); completed it. All {found.records + 1} records are kept.")
    # The side file is durable before the journal is cut: a crash in between leaves the tail
    # in both places, never in neither.
    side = side_file(path, "torn", found.tail)
    os.truncate(path, found.tail_start)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return (f"{path}: the last line was torn ({len(found.tail)} bytes of an interrupted write); "
            f"moved it to {side.name} beside the journal. All {found.records} complete records "
            f"are kept.")


def clear_stale_mutex(path: Path) -> None:
    mutex = path.with_name(JOURNAL_MUTEX)
    with contextlib.suppress(FileNotFoundError):
        # We hold the study lock, so no tuner writes; a mutex this old is a killed append's.
        if time.time() - mutex.lstat().st_mtime > 5:
            mutex.unlink()


class _BeatingRDB(optuna_compat.HookedRDB):
    """An RDBStorage that records heartbeats for the trials this process runs. Optuna beats only
    inside Study.optimize; the tuner asks and tells, so it beats itself, from a thread."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._mine: set[int] = set()
        self._beats_lock = threading.Lock()
        self._beater: threading.Thread | None = None

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        for key in ("_beats_lock", "_beater"):
            state.pop(key, None)
        state["_mine"] = set()
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._beats_lock, self._beater = threading.Lock(), None

    def trial_created(self, trial: FrozenTrial) -> None:
        if trial.state == TrialState.RUNNING:
            self._beat_for(optuna_compat.trial_id(trial))

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Any = None) -> bool:
        changed = super().set_trial_state_values(trial_id, state, values)
        if changed and state == TrialState.RUNNING:  # an enqueued trial taken by ask()
            self._beat_for(trial_id)
        elif state.is_finished():
            with self._beats_lock:
                self._mine.discard(trial_id)
        return changed

    def _beat_for(self, trial_id: int) -> None:
        self.record_heartbeat(trial_id)
        with self._beats_lock:
            self._mine.add(trial_id)
            if self._beater is None:
                self._beater = threading.Thread(target=self._beat, daemon=True,
                                                name="tuner-heartbeat")
                self._beater.start()

    def _beat(self) -> None:
        while True:
            time.sleep(self.heartbeat_interval or HEARTBEAT_INTERVAL_S)
            with self._beats_lock:
                mine = list(self._mine)
                if not mine:
                    self._beater = None
                    return
            for trial_id in mine:
                # A missed beat is retried next interval; a database away for longer than the
                # grace period makes the trial stale, which is then the truth.
                with contextlib.suppress(Exception):
                    self.record_heartbeat(trial_id)


def open_rdb(url: str) -> RDBStorage:
    """An Optuna RDB storage with heartbeats, so a resume fails only trials whose driver is
    gone (stale heartbeat), never a live driver's on another host."""
    import optuna

    # The tuner drives trials with ask/tell; Optuna warns that heartbeats are meant for
    # Study.optimize, but _BeatingRDB beats for ask/tell trials itself.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return _BeatingRDB(url, heartbeat_interval=HEARTBEAT_INTERVAL_S,
                               grace_period=HEARTBEAT_GRACE_S)
        except ModuleNotFoundError as e:  # optuna imports sqlalchemy/alembic only here
            raise ConfigError(
                f"--storage {url.split('://')[0]}://...: Optuna's database storage needs "
                f"{e.name}, which is not installed. Install it (pip install sqlalchemy "
                "alembic; an offline GPU bundle: scripts/gpu_bundle.sh --with-rdb), or leave "
                "--storage out to keep the study in its folder's journal file.") from None


def orphans(study: Any) -> list[FrozenTrial]:
    """RUNNING trials whose driver is dead. Under the folder lock that is every one of them; in
    a shared database only those whose heartbeat went stale."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    stale = optuna_compat.stale_trial_ids(study)
    if stale is None:
        return running
    return [t for t in running if optuna_compat.trial_id(t) in stale]


# --- one driver per study ----------------------------------------------------------------------
@dataclass
class _Driver:
    say: Say
    fds: dict[Path, int] = field(default_factory=dict)


_DRIVERS: list[_Driver] = []


@contextlib.contextmanager
def driver(*, say: Say = print) -> Iterator[None]:
    """Mark this call as a driver: the studies it opens for writing stay locked until it ends."""
    me = _Driver(say)
    _DRIVERS.append(me)
    try:
        yield
    finally:
        _DRIVERS.remove(me)
        for fd in me.fds.values():
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # an empty lock file: released cleanly
            os.close(fd)  # closing drops the flock


def take_lock(study_dir: Path) -> Say:
    """Take the study lock for the current driver (once); returns where to say things."""
    if not _DRIVERS:
        raise RuntimeError("writing a study needs the study lock: open it inside "
                           "tuner.search.storage.driver() (api.optimize/policy/repair do)")
    key = study_dir.resolve()
    for d in _DRIVERS:
        if key in d.fds:
            return d.say
    me = _DRIVERS[-1]
    if study_dir.exists() and not study_dir.is_dir():
        raise ConfigError(f"'{study_dir}' is a file, not a study folder. Pass a folder path "
                          f"(it is created if missing), e.g. --output-dir outputs/my-study.")
    study_dir.mkdir(parents=True, exist_ok=True)
    path = study_dir / LOCK
    # os.open makes a non-inheritable descriptor: engines started later never hold the lock.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(study_dir, _holder(fd, wait_s=1.0)) from None
        before = _holder(fd, wait_s=0.0)
        holder = _Holder(pid=os.getpid(), host=socket.gethostname(),
                         since=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                         argv=tuple(sys.argv[:40]))
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.line(), 0)
        os.fsync(fd)
    except OSError as e:
        os.close(fd)
        raise OSError(e.errno, e.strerror, e.filename or str(path)) from e
    except BaseException:
        os.close(fd)
        raise
    me.fds[key] = fd
    if before is not None:
        me.say(f"Study {study_dir}: took over the lock of tuner pid {before.pid} on host "
               f"{before.host} (since {before.since}), which stopped without releasing it.")
    return me.say


@dataclass(frozen=True)
class _Holder:
    """The driver that holds a study lock, as the lock file records it (one JSON line; None
    for what it lacks). The command line is there for a person reading the file."""

    pid: int | None = None
    host: str | None = None
    since: str | None = None  # UTC, ISO 8601
    argv: tuple[str, ...] = ()

    @classmethod
    def parse(cls, data: bytes) -> _Holder | None:
        """The holder a lock file's bytes name; None where they are no (or an empty) JSON
        object: a lock file is emptied when its lock is released."""
        try:
            found = json.loads(data or b"null")
        except ValueError:
            return None
        if not isinstance(found, dict) or not found:
            return None
        pid, argv = found.get("pid"), found.get("argv")
        text = {k: v if isinstance(v := found.get(k), str) else None for k in ("host", "since")}
        return cls(pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                   host=text["host"], since=text["since"],
                   argv=tuple(str(a) for a in argv) if isinstance(argv, list) else ())

    def line(self) -> bytes:
        return (json.dumps({"pid": self.pid, "host": self.host, "since": self.since,
                            "argv": list(self.argv)}) + "\n").encode()


def _holder(fd: int, *, wait_s: float) -> _Holder | None:
    """The holder recorded in the lock file; a holder that has just taken it may not have
    written itself yet, so read again for up to wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        found = _Holder.parse(os.pread(fd, 4096, 0))
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def _in_use(study_dir: Path, holder: _Holder | None) -> ConfigError:
    """The error that refuses a second driver on a study, naming the one that holds it."""
    who = (f"tuner pid {holder.pid} on host {holder.host} since {holder.since}"
           if holder is not None else "another tuner process")
    stop = (f"stop it (kill {holder.pid} on {holder.host})" if holder is not None
            else "stop it")
    return ConfigError(
        f"Study {study_dir} is in use by {who}; wait for it, or {stop} and run this command "
        f"again. Two drivers on one study would fail each other's running trials.")
