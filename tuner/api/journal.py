"""A study's journal as tuner.api writes it: one driver at a time (one_driver holds the
study's lock for the call), and the repair of a journal a crash left with bad lines."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

Say = Callable[[str], None]


def one_driver(fn):
    """The decorated call is a driver: a study it opens for writing stays locked until the call
    returns (tuner.search.storage), so two drivers never write one study."""

    @functools.wraps(fn)
    def as_driver(*args, **kwargs):
        from tuner.search import storage

        with storage.driver(say=kwargs.get("say", print)):
            return fn(*args, **kwargs)

    return as_driver


@one_driver
def repair(*, study_dir: Path, say: Say = print) -> str:
    """Quarantine the bad lines of a study's journal, keep every good record, check it loads."""
    from tuner.outputs import journal_repair
    from tuner.search import repair as journal

    return journal_repair.repair_text(journal.repair(study_dir))
