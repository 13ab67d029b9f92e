"""Study: a study's values are named after its objectives (optuna-dashboard shows the names,
not "Objective 0/1"), in new studies and in old ones when they resume; a study resumes with
the drafters it launched, and a method's first drafter joins them."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import optuna
import pytest
from study_fakes import fake_settings

from tuner.errors import ConfigError
from tuner.records.storage import StudySettings
from tuner.search import samplers, storage
from tuner.search import study as st

OLD_STUDY = Path(__file__).resolve().parent.parent / "data" / "old_study_grid"
SETTINGS = fake_settings()


def _create(out: Path, settings: StudySettings, name: str = "s") -> optuna.Study:
    with storage.driver(say=lambda _m: None):
        return st.create(out_dir=out, name=name, objectives=list(settings.objectives),
                         sampler=samplers.make_sampler("random", seed=0, constrained=False),
                         storage_url=None, settings=settings)


def test_a_new_study_names_its_values_after_the_objectives_without_a_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna's ExperimentalWarning must not reach a user
        study = _create(tmp_path / "s", SETTINGS)
    assert study.metric_names == ["output_throughput", "mean_tpot_ms"]
    # Stored in the journal, where optuna-dashboard reads it.
    assert st.open_existing(tmp_path / "s").metric_names == ["output_throughput", "mean_tpot_ms"]


def test_an_old_study_without_names_gets_them_when_it_resumes(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    shutil.copy(OLD_STUDY / "study.journal", out / "study.journal")
    old = st.open_existing(out)
    assert old.metric_names is None
    before = [(t.number, t.state, t.values) for t in old.get_trials()]
    settings = st.settings_of(old)
    study = _create(out, settings, name=old.study_name)
    assert study.metric_names == list(settings.objectives) == ["output_throughput",
                                                               "mean_tpot_ms"]
    again = st.open_existing(out)
    assert again.metric_names == list(settings.objectives)
    assert [(t.number, t.state, t.values) for t in again.get_trials()] == before


def test_constrained_samplers_build_without_optunas_deprecation_warning():
    # Optuna 5 deprecates constraints_func (FutureWarning on every `--sampler nsga2` run);
    # it is kept since Optuna 4, which pyproject allows, lacks Trial.set_constraint.
    for name in ("nsga2", "tpe", "gp"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert samplers.make_sampler(name, seed=0, constrained=True) is not None


def test_a_study_resumes_with_its_drafters_and_refuses_another(tmp_path):
    out = tmp_path / "s"
    _create(out, SETTINGS)  # no drafter (an n-gram space), as studies stored before them
    assert "drafters" not in st.open_existing(out).user_attrs["tuner"]
    _create(out, SETTINGS.model_copy(update={"drafters": {"draft_model": "/d/a"}}))
    assert st.settings_of(st.open_existing(out)).drafters == {"draft_model": "/d/a"}
    with pytest.raises(ConfigError, match=r"started with the drafter /d/a \(method "
                       r"draft_model\); this command asks for /d/b.*new --output-dir"):
        _create(out, SETTINGS.model_copy(update={"drafters": {"draft_model": "/d/b"}}))
    _create(out, SETTINGS.model_copy(update={"drafters": {"eagle": "/d/head"}}))
    assert st.settings_of(st.open_existing(out)).drafters == {"draft_model": "/d/a",
                                                              "eagle": "/d/head"}
