"""Search spaces: built-ins load when installed, conditional params, min <= max by
construction, grid enumeration, and clear errors naming the bad key."""

from __future__ import annotations

import optuna
import pytest

from tuner.errors import ConfigError
from tuner.search import space


def test_builtin_spaces_load_and_include_the_baseline():
    assert {"ngram", "suffix", "default", "draft"} <= set(space.available())
    for name in space.available():
        sp = space.load(name)
        assert "none" in sp.methods
        for point in sp.start_points:
            params = sp.params_of(point)
            if sp.methods.get(point["method"]) and all(
                    not isinstance(v, space.Param) or k in point
                    for k, v in sp.methods[point["method"]].items()):
                assert params, (name, point)


def test_ngram_window_min_never_exceeds_max_under_random_sampling():
    sp = space.load("ngram")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = 0
    for _ in range(300):
        trial = study.ask()
        cfg = sp.suggest(trial)
        study.tell(trial, 0.0)
        if cfg.method == "ngram":
            s = cfg.speculative_config
            assert 1 <= s["prompt_lookup_min"] <= s["prompt_lookup_max"] <= 6
            assert 1 <= s["num_speculative_tokens"] <= 8
            seen += 1
    assert seen > 100


def test_grid_enumerates_every_valid_ngram_config():
    grid = space.load("ngram").grid()
    ngram = [g for g in grid if g["method"] == "ngram"]
    # k in 1..8, max in 2..6, min in 1..max: 8 * (2+3+4+5+6) = 160
    assert len(ngram) == 160
    assert all(g["ngram.prompt_lookup_min"] <= g["ngram.prompt_lookup_max"] for g in ngram)
    assert len(grid) == 160  # the baseline is enqueued on its own, never a grid point


def test_config_from_params_round_trips_and_fills_fixed_values():
    sp = space.load("draft")
    cfg = sp.config_from_params({"method": "draft_model",
                                 "draft_model.num_speculative_tokens": 3})
    assert cfg.speculative_config == {"method": "draft_model", "model": "/models/draft-model",
                                      "num_speculative_tokens": 3,
                                      "draft_tensor_parallel_size": 1}
    assert space.load("ngram").config_from_params({"method": "none"}).speculative_config is None


@pytest.mark.parametrize("raw, fragment", [
    ([1, 2], "expected a mapping"),
    ({"methods": {}}, "`methods` must be a non-empty mapping"),
    ({"methods": {"magic": {}}}, "unknown method 'magic'"),
    ({"methods": {"ngram": {"num_speculative_tokens": {"type": "int", "low": 5, "high": 2}}}},
     "impossible range: low 5.0 > high 2.0"),
    ({"methods": {"ngram": {"k": {"type": "banana", "low": 1, "high": 2}}}}, "unknown type 'banana'"),
    ({"methods": {"ngram": {"k": {"type": "int", "low": 1}}}}, "needs both `low` and `high`"),
    ({"methods": {"ngram": {"k": {"type": "int", "low": 1, "high": 3, "at_most": "x"}}}},
     "refers to 'x'"),
    ({"methods": {"ngram": {"a": {"type": "int", "low": 1, "high": 2},
                            "b": {"type": "int", "low": 3, "high": 4, "at_most": "a"}}}},
     "impossible range"),
    ({"methods": {"draft_model": {"num_speculative_tokens": 3}}}, "`model` is required"),
    ({"methods": {"ngram": {}}, "extra": 1}, "unknown top-level key"),
    ({"methods": {"ngram": {"k": {"type": "int", "low": 1, "high": 2, "bogus": 1}}}},
     "methods.ngram.k"),
    ({"methods": {"ngram": {"k": [1, 2]}}}, "choice"),
])
def test_bad_spaces_raise_config_error_naming_the_problem(raw, fragment):
    with pytest.raises(ConfigError) as e:
        space.parse(raw, source="my.yaml")
    assert fragment in str(e.value)
    assert "my.yaml" in str(e.value)


def test_unknown_space_and_malformed_yaml(tmp_path):
    with pytest.raises(ConfigError, match="Unknown search space 'ngrm'. Available: .*ngram"):
        space.load("ngrm")
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods: [ngram\n  oops")
    with pytest.raises(ConfigError, match="not valid YAML"):
        space.load(str(bad))
