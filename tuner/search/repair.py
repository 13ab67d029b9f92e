"""Search stage, repairing a study's journal (`tuner repair`): every bad line moved into a
quarantine file beside it, every good record kept (also one glued to a torn line), the
studies loaded again to check. Nothing is deleted. The journal's format and its lock are
tuner.search.storage's.
"""

from __future__ import annotations

import os
from pathlib import Path

from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from tuner.errors import ConfigError
from tuner.records.outcomes import JournalRepair, RepairedLine
from tuner.search import storage as store
from tuner.search.storage import JOURNAL


def _salvage(line: bytes, replay: store.Replay) -> int | None:
    """Where a whole record starts inside a bad line: a torn line that the next record was
    appended to (what Optuna does after a torn write) still carries that record."""
    start = line.find(b'{"op_code":', 1)
    while start > 0:
        if replay.accepts(line[start:]) is None:
            return start
        start = line.find(b'{"op_code":', start + 1)
    return None


def repair(study_dir: Path) -> JournalRepair:
    """Move every bad line of the journal into `study.journal.quarantine-<UTC time>` beside it,
    keep every good record (also one glued to a torn line), check that the studies load, and
    return what was done (tuner.outputs words it). Takes the study lock (inside driver())."""
    path = study_dir / JOURNAL
    if not path.exists():
        raise ConfigError(f"No journal in '{study_dir}' (no {JOURNAL}). Pass the folder that "
                          f"`tuner optimize` printed, e.g. outputs/instructcoder-smollm2.")
    store.take_lock(study_dir)
    data = path.read_bytes()
    replay = store.Replay()
    keep: list[bytes] = []
    moved: list[bytes] = []
    notes: list[RepairedLine] = []
    for number, _, line in store.journal_lines(data):
        why = replay.accepts(line)
        whole = line if line.endswith(b"\n") else line + b"\n"
        if why is None:
            keep.append(whole)
            continue
        cut = _salvage(line, replay)
        if cut is not None:
            moved.append(line[:cut] + b"\n")
            keep.append(whole[cut:])
            notes.append(RepairedLine(line=number, salvaged=True))
        else:
            moved.append(whole)
            notes.append(RepairedLine(line=number, why=why))
    if not moved:
        return JournalRepair(journal=path, kept=len(keep))
    side = store.side_file(path, "quarantine", b"".join(moved))
    tmp = path.with_name(path.name + ".repair-tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(b"".join(keep))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(tmp)) from e
    os.replace(tmp, path)
    store.fsync_dir(study_dir)
    store.clear_stale_mutex(path)
    return JournalRepair(journal=path, kept=len(keep), lines=tuple(notes),
                         quarantine=side.name, studies=_verify(path))


def _verify(path: Path) -> tuple[tuple[str, int], ...]:
    """The studies the journal loads now, with their trials."""
    import optuna

    storage = JournalStorage(JournalFileBackend(str(path)))
    return tuple((frozen.study_name, len(optuna.load_study(
        study_name=frozen.study_name, storage=storage).get_trials(deepcopy=False)))
        for frozen in storage.get_all_studies())
