"""Search stage: the one place that reaches into Optuna's private API, where it has no public one.

A driver that asks and tells (instead of Study.optimize) needs three things Optuna keeps
private: a study's storage and ids (to create a trial no WAITING one replaces, and to fail a
dead driver's trial from another process); every trial an RDB storage creates (Optuna beats
only inside Study.optimize, so the tuner beats itself, and Optuna's _CachedStorage creates
trials through the private RDBStorage._create_new_trial); and the RUNNING trials whose
heartbeat went stale, without failing them first as the public fail_stale_trials does (a
failed trial's attrs can no longer say why). Read against the Optuna versions in CHECKED;
tests/unit/test_optuna_compat.py fails on any other until this file is read again.
"""

from __future__ import annotations

from typing import Any

from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial

# (major, minor) of the first and the last Optuna release these names were checked against.
CHECKED = ((4, 0), (5, 1))


def storage_of(study: Any) -> BaseStorage:
    """The storage an open study reads and writes (an RDBStorage comes wrapped in a cache)."""
    return study._storage


def study_id(study: Any) -> int:
    return study._study_id


def trial_id(trial: Any) -> int:
    """The storage's id of a Trial or a FrozenTrial (not its number within the study)."""
    return trial._trial_id


def stale_trial_ids(study: Any) -> set[int] | None:
    """The study's RUNNING trials whose heartbeat went stale; None where the storage keeps no
    heartbeats (a journal file: there the study lock tells a dead driver)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    storage = storage_of(study)
    if not is_heartbeat_enabled(storage):
        return None
    return set(storage._get_stale_trial_ids(study_id(study)))


class HookedRDB(RDBStorage):
    """An RDBStorage that calls `trial_created` with every trial it creates, whether a study
    asks through Optuna's cache (the private `_create_new_trial`) or not (`create_new_trial`,
    which calls it)."""

    def trial_created(self, trial: FrozenTrial) -> None:
        """Override to act on a new trial; it is stored already."""

    def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None
                          ) -> FrozenTrial:
        trial = super()._create_new_trial(study_id, template_trial)
        self.trial_created(trial)
        return trial
