"""tuner.search.optuna_compat: the Optuna versions its private names were checked against, and
that those names still mean what it uses them for. An Optuna upgrade fails here, by name, not
deep inside a study: read optuna_compat.py against the new version, then widen CHECKED."""

from __future__ import annotations

import inspect
import re

import optuna
import pytest
from optuna.storages import RDBStorage, _CachedStorage

from tuner.search import optuna_compat


def _minor(version: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def test_the_installed_optuna_is_one_the_private_names_were_checked_against():
    first, last = optuna_compat.CHECKED
    assert first <= _minor(optuna.__version__) <= last, (
        f"Optuna {optuna.__version__} is outside the versions tuner/search/optuna_compat.py was "
        f"checked against ({first[0]}.{first[1]} to {last[0]}.{last[1]}): check its private "
        "names against this version, then widen CHECKED.")


def test_the_private_names_exist():
    from optuna.storages import _heartbeat

    assert callable(_heartbeat.is_heartbeat_enabled)
    assert callable(RDBStorage._get_stale_trial_ids)
    assert callable(RDBStorage._create_new_trial)
    # Optuna's cache, which wraps every RDBStorage a study opens, creates trials through it.
    assert "._create_new_trial(" in inspect.getsource(_CachedStorage.create_new_trial)


def test_a_study_and_its_trials_carry_the_ids_the_tuner_reads():
    study = optuna.create_study()
    trial = study.ask()
    storage = optuna_compat.storage_of(study)
    assert isinstance(storage, optuna.storages.BaseStorage)
    frozen = storage.get_trial(optuna_compat.trial_id(trial))
    assert frozen.number == trial.number
    assert optuna_compat.trial_id(frozen) == optuna_compat.trial_id(trial)
    assert storage.get_study_id_from_name(study.study_name) == optuna_compat.study_id(study)
    assert optuna_compat.stale_trial_ids(study) is None  # in memory: no heartbeats


def test_every_trial_a_study_asks_through_optunas_cache_reaches_the_hook(tmp_path):
    pytest.importorskip("sqlalchemy")
    created = []

    class Hooked(optuna_compat.HookedRDB):
        def trial_created(self, trial):
            created.append(trial.number)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=Hooked(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    study.enqueue_trial({"x": 1})
    study.ask()  # the enqueued trial: created when it was enqueued
    study.ask()  # a new one, through _CachedStorage
    assert created == [0, 1]
