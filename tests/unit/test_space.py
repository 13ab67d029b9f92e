"""Search spaces: built-ins load when installed, conditional params, min <= max by
construction, grid enumeration, and clear errors naming the bad key; methods and keys checked
against the installed vLLM's SpeculativeConfig (read without importing vLLM), and parameters
against Optuna's distributions, at parse time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import optuna
import pytest

from tuner.errors import ConfigError
from tuner.search import space
from tuner.speculative import schema as spec_schema


def test_builtin_spaces_load_and_include_the_baseline():
    assert {"ngram", "suffix", "default", "draft"} <= set(space.available())
    for name in space.available():
        sp = space.load(name)
        assert "none" in sp.methods
        for point in sp.start_points:
            params = sp.params_of(point)
            if sp.methods.get(point.method) and all(
                    not isinstance(v, space.Param) or k in dict(point.values)
                    for k, v in sp.methods[point.method].items()):
                assert params is not None, (name, point)


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
    ngram = [g for g in grid if g.method == "ngram"]
    # k in 1..8, max in 2..6, min in 1..max: 8 * (2+3+4+5+6) = 160
    assert len(ngram) == 160
    assert all(g.value("prompt_lookup_min") <= g.value("prompt_lookup_max") for g in ngram)
    assert ngram[0].params() == {"method": "ngram", "ngram.num_speculative_tokens": 1,
                                 "ngram.prompt_lookup_max": 2, "ngram.prompt_lookup_min": 1}
    assert len(grid) == 160  # the baseline is enqueued on its own, never a grid point


def test_config_from_params_round_trips_and_fills_fixed_values():
    sp = space.load("draft")
    cfg = sp.config_from_params(space.Point.from_params(
        {"method": "draft_model", "draft_model.num_speculative_tokens": 3}))
    assert cfg.speculative_config == {"method": "draft_model", "model": "embedded-draft",
                                      "num_speculative_tokens": 3,
                                      "draft_tensor_parallel_size": 1}
    assert space.load("ngram").config_from_params(
        space.Point(method="none")).speculative_config is None


K = "num_speculative_tokens"


def test_a_point_is_its_optuna_params_and_a_start_point_names_its_searched_values():
    sp = space.parse({"methods": {"ngram": {K: {"type": "int", "low": 1, "high": 4},
                                            "prompt_lookup_max": 4}},
                      "engine": {"max_num_seqs": {"type": "choice", "values": [8, 16]}},
                      "start_points": [{"method": "ngram", "prompt_lookup_max": 9, K: 2,
                                        "engine": {"max_num_seqs": 16}},
                                       {"method": "ngram", K: 2}]})
    grid = sp.grid()
    assert len(grid) == len(set(grid)) == 8
    assert all(space.Point.from_params(p.params()) == p for p in grid)
    full, partial = sp.start_points
    point = sp.params_of(full)
    assert point.params() == {"method": "ngram", "ngram.num_speculative_tokens": 2,
                              "engine.max_num_seqs": 16}  # the fixed value is the space's
    assert point in set(grid) and sp.params_of(partial) is None  # a searched knob is missing
    cfg = sp.config_from_params(point)
    assert cfg.speculative_config == {"method": "ngram", K: 2, "prompt_lookup_max": 4}
    assert cfg.engine_args == {"max_num_seqs": 16} and sp.point_of(cfg) == point
    assert point.with_value(K, 3).value(K) == 3 and point.value("absent") is None


@pytest.mark.parametrize("raw, fragment", [
    ([1, 2], "expected a mapping"),
    ({"methods": {}}, "`methods` must be a non-empty mapping"),
    ({"methods": {"magic": {}}}, "unknown method 'magic'"),
    ({"methods": {"ngram": {"num_speculative_tokens": {"type": "int", "low": 5, "high": 2}}}},
     "impossible range: low 5.0 > high 2.0"),
    ({"methods": {"ngram": {K: {"type": "banana", "low": 1, "high": 2}}}}, "unknown type 'banana'"),
    ({"methods": {"ngram": {K: {"type": "int", "low": 1}}}}, "needs both `low` and `high`"),
    ({"methods": {"ngram": {K: {"type": "int", "low": 1, "high": 3, "at_most": "x"}}}},
     "refers to 'x'"),
    ({"methods": {"ngram": {"prompt_lookup_max": {"type": "int", "low": 1, "high": 2},
                            "prompt_lookup_min": {"type": "int", "low": 3, "high": 4,
                                                  "at_most": "prompt_lookup_max"}}}},
     "impossible range"),
    ({"methods": {"draft_model": {"num_speculative_tokens": 3}}}, "`model` is required"),
    ({"methods": {"ngram": {}}, "extra": 1}, "unknown top-level key"),
    ({"methods": {"ngram": {K: {"type": "int", "low": 1, "high": 2, "bogus": 1}}}},
     "methods.ngram.num_speculative_tokens: invalid parameter spec"),
    ({"methods": {"ngram": {K: [1, 2]}}}, "choice"),
    ({"methods": {"ngram": {K: {"type": "int", "low": 1, "high": 8, "step": 1.5}}}},
     "methods.ngram.num_speculative_tokens.step: an int range steps by a whole number"),
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


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed in this Python")


@needs_vllm
def test_methods_of_the_installed_vllm_are_accepted():
    sp = space.parse({"methods": {"dflash": {"model": "/m", "num_speculative_tokens": 4},
                                  "deepseek_mtp": {"num_speculative_tokens": 1},
                                  "qwen3_next_mtp": {}}}, source="my.yaml")
    assert sp.speculative_methods() == ["dflash", "deepseek_mtp", "qwen3_next_mtp"]
    assert spec_schema.vllm_schema().origin.startswith("SpeculativeConfig of vLLM")


def test_unknown_method_names_close_matches_and_every_valid_method():
    with pytest.raises(ConfigError) as e:
        space.parse({"methods": {"dflsh": {}}}, source="my.yaml")
    msg = str(e.value)
    assert msg.startswith("my.yaml: methods.dflsh: unknown method 'dflsh'. Did you mean 'dflash'?")
    assert "none, ngram, medusa" in msg and "qwen3_next_mtp" in msg


def test_unknown_key_is_refused_at_parse_time_with_close_matches_and_the_valid_keys(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("methods:\n  ngram:\n    num_speculative_tokens: {type: int, low: 1, high: 4}"
                    "\n    prompt_lookup_mx: 4\n")
    with pytest.raises(ConfigError) as e:
        space.load(str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: methods.ngram.prompt_lookup_mx: unknown speculative-config "
                          f"key 'prompt_lookup_mx'. Did you mean 'prompt_lookup_max' or "
                          f"'prompt_lookup_min'? Valid (")
    assert "suffix_decoding_max_tree_depth, " in msg and "Fix the key in the file" in msg
    assert ", method," not in msg  # the block names the method


@pytest.mark.parametrize("raw, fragment", [
    ({"methods": {"ngram": {"method": "suffix"}}},
     "methods.ngram.method: the method is the name of this block (ngram)"),
    ({"methods": {"ngram": {}}, "start_points": [{"method": "ngram", "num_speculative_token": 3}]},
     "start_points[0].num_speculative_token: unknown speculative-config key"),
    ({"methods": {"ngram": {K: {"type": "int", "low": 1, "high": 8, "step": 2, "log": True}}}},
     "methods.ngram.num_speculative_tokens: Optuna refuses the int parameter"),
    ({"methods": {"suffix": {"suffix_decoding_min_token_prob": {
        "type": "float", "low": 0.05, "high": 0.3, "step": 0.05, "log": True}}}},
     "methods.suffix.suffix_decoding_min_token_prob: Optuna refuses the float parameter"),
    ({"methods": {"ngram": {}}, "engine": {"gpu_memory_utilization": {
        "type": "float", "low": 0.5, "high": 0.9, "step": 0.1, "log": True}}},
     "engine.gpu_memory_utilization: Optuna refuses the float parameter"),
    ({"methods": {"ngram": {K: {"type": "choice", "values": [2, [3]]}}}},
     "methods.ngram.num_speculative_tokens.values[1]: [3] is no value Optuna can store"),
    ({"methods": {"ngram": {}}, "start_points": [{"method": "ngram", K: [3]}]},
     "start_points[0].num_speculative_tokens: a start point sets each key to one value"),
    ({"methods": {"ngram": {}}, "start_points": [{"method": 3}]},
     "start_points[0].method: expected a method name"),
    ({"methods": {"ngram": {}}, "start_points": [{"method": "ngram", "engine": [1]}]},
     "start_points[0].engine: expected a mapping of engine knobs"),
])
def test_keys_and_distributions_fail_at_parse_not_at_the_first_trial(raw, fragment):
    with pytest.raises(ConfigError) as e:
        space.parse(raw, source="my.yaml")
    assert f"my.yaml: {fragment}" in str(e.value)


def test_dashes_in_keys_read_as_underscores_as_vllm_reads_them():
    sp = space.parse({"methods": {"ngram": {"prompt-lookup-max": 3}}}, source="my.yaml")
    assert sp.methods["ngram"] == {"prompt-lookup-max": 3}
    with pytest.raises(ConfigError, match="methods.ngram.prompt-lookup-max: 65"):
        space.parse({"methods": {"ngram": {"prompt-lookup-max": 65}}}, source="my.yaml")


def test_without_vllm_the_fallback_list_is_used_and_the_message_says_so(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    spec_schema.vllm_schema.cache_clear()
    try:
        assert spec_schema.vllm_schema().methods == spec_schema.FALLBACK_METHODS
        space.parse({"methods": {"dflash": {"model": "/m"}}})
        with pytest.raises(ConfigError, match=r"Did you mean 'prompt_lookup_max'.*Valid \(spec-"
                           r"tuner's copy of vLLM 0\.32\.0's SpeculativeConfig, as vLLM is not "
                           r"importable in "):
            space.parse({"methods": {"ngram": {"prompt_lookup_mx": 4}}})
    finally:
        spec_schema.vllm_schema.cache_clear()


@needs_vllm
def test_fallback_lists_are_those_of_the_vllm_they_name():
    if spec_schema.vllm_version() != spec_schema.FALLBACK_VERSION:
        pytest.skip(f"vLLM {spec_schema.vllm_version()} installed, fallback is {spec_schema.FALLBACK_VERSION}")
    schema = spec_schema.vllm_schema()
    assert (schema.methods, schema.keys) == (spec_schema.FALLBACK_METHODS, spec_schema.FALLBACK_KEYS)


def test_source_reader_resolves_aliases_and_gives_up_on_imported_ones(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "speculative.py").write_text(
        "A = Literal['a']\nB = Literal['b', A]\n"
        "class SpeculativeConfig:\n    method: B | None = None\n"
        "    target_model_config: SkipValidation[int] = None\n    model: str = ''\n")
    assert spec_schema._schema_from_source(tmp_path) == (("b", "a"), ("method", "model"))
    (config / "speculative.py").write_text(
        "from elsewhere import M\nclass SpeculativeConfig:\n    method: M | None = None\n")
    assert spec_schema._schema_from_source(tmp_path) is None  # vllm_schema then imports vLLM


@needs_vllm
def test_reading_the_source_finds_what_importing_vllm_finds():
    root = Path(list(importlib.util.find_spec("vllm").submodule_search_locations)[0])
    from_source = spec_schema._schema_from_source(root)
    assert from_source is not None and "dflash" in from_source[0]
    assert "target_model_config" not in from_source[1]
    assert from_source == spec_schema._schema_from_import()  # imports vllm.config: about 8 s


