"""Bounds on every input (tuner.checks and the loaders that use it): each refusal is one
ConfigError line naming the bad value, the valid range or cause, and what to do; values
inside the bounds pass unchanged. The CLI cases run tuner.cli.main in-process with the api
replaced by a recorder (what the parse checks), or with the first stage after every check
(loading the workload) replaced (what tuner.api checks as it resolves the options), so
nothing is launched."""

from __future__ import annotations

import errno
import json
import math
import os
import resource
from pathlib import Path

import pytest

from tuner import api, checks, cli, engine_cmdline
from tuner.errors import ConfigError
from tuner.measure import workloads
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import (
    AlignedBaselineFlags,
    BenchOptions,
    EngineOptions,
    OptimizeOptions,
    PolicyOptions,
)
from tuner.search import space, space_values

TOK = str(workloads.EMBEDDED_TOKENIZER)


def refused(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args, **kwargs)
    message = str(e.value)
    assert "\n" not in message and message.strip()
    return message


# --- the table --------------------------------------------------------------------------------
def test_the_documented_message_for_a_nan_timeout():
    assert refused(checks.check, "request_timeout", "nan") == (
        "--request-timeout nan: must be a finite number of seconds between 0.1 and 86400 (a "
        "request longer than a day is a hang). Example: --request-timeout 300.")


def _outside(bound: checks.Bound) -> list[str]:
    out = ["nan", "inf", "-inf", "1e300", "abc", "", repr(bound.low - 1), repr(bound.high + 1)]
    if bound.kind is int:
        out += ["2.5", str(int(bound.high) + 1), "9" * 400, "9" * 5000]
    return out


@pytest.mark.parametrize("name", sorted(checks.BOUNDS))
def test_every_bound_refuses_what_lies_outside_it_and_names_the_range(name):
    bound = checks.BOUNDS[name]
    for text in _outside(bound):
        message = refused(checks.check, name, text)
        assert message.startswith(f"{bound.flag} {checks.show(text)}: must be "), message
        assert f"between {checks.bounds._num(bound.low)} and {checks.bounds._num(bound.high)}" in message
        assert f"({bound.why})" in message and message.endswith(f"{bound.example}.")


@pytest.mark.parametrize("name", sorted(checks.BOUNDS))
def test_every_bound_keeps_its_ends_and_its_example(name):
    bound = checks.BOUNDS[name]
    for value in (bound.low, bound.high):
        text = str(int(value)) if bound.kind is int else repr(float(value))
        got = checks.check(name, text)
        assert got == value and type(got) is bound.kind
    if "," not in bound.example:
        assert checks.check(name, bound.example) == bound.kind(bound.example)


def test_a_long_or_multiline_bad_value_is_quoted_and_cut_to_one_line():
    message = refused(checks.check, "num_prompts", "12\n" + "x" * 500)
    assert message.startswith("--num-prompts '12\\nxxx") and "..." in message


def test_fractional_gpus_only_below_one():
    assert checks.check("gpus_per_trial", "0.5") == 0.5
    assert checks.check("gpus_per_trial", "2") == 2.0
    assert "fraction only below 1" in refused(checks.check, "gpus_per_trial", "1.5")


# --- lists ------------------------------------------------------------------------------------
def test_concurrency_levels_are_bounded_distinct_and_few():
    assert checks.int_list("1, 8,8,32", "concurrency") == (1, 8, 32)
    m = refused(checks.int_list, "100000", "concurrency")
    assert "--concurrency '100000'" in m and "from 1 to 4096" in m and "socket" in m
    assert "at most 32" in refused(checks.int_list, ",".join(map(str, range(1, 40))),
                                   "concurrency")
    assert "expected positive integers" in refused(checks.int_list, "1,x", "concurrency")


def test_ladder_must_rise_and_k_values_keep_repeats():
    assert "--ladder '4,2' must rise" in refused(checks.int_list, "4,2", "ladder", rising=True)
    assert checks.int_list("5,5,2", "k_values", unique=False) == (5, 5, 2)
    assert "--k-values '65'" in refused(checks.int_list, "65", "k_values")


def test_list_options_convert_as_argparse_parses_and_blank_means_the_default():
    ladder = checks.list_option("ladder", rising=True, blank=True)
    assert ladder("1,2,4") == (1, 2, 4) and ladder(" ") is None and ladder.bound == "ladder"
    assert "--levels '0'" in refused(checks.list_option("levels"), "0")
    assert "every value must be a positive integer" in refused(checks.list_option("concurrency"), "")


def test_the_policy_ladder_is_as_given_or_powers_of_two_up_to_its_top():
    assert checks.ladder(PolicyOptions(ladder=(1, 3, 9))) == (1, 3, 9)
    assert checks.ladder(PolicyOptions()) == (1, 2, 4, 8, 16)
    assert checks.ladder(PolicyOptions(ladder_max=12)) == (1, 2, 4, 8, 12)


# --- converters of single options -------------------------------------------------------------
def test_name_value_pairs_and_command_lines():
    assert checks.name_value("--engine-env")("A=b=c") == ("A", "b=c")
    assert checks.name_value("--metadata", strip=True)(" run = 3") == ("run", "3")
    assert "--engine-env 'novalue': expected NAME=VALUE" in refused(
        checks.name_value("--engine-env"), "novalue")
    assert checks.command_line("--engine-args")("-tp 2 --enforce-eager") == (
        "-tp", "2", "--enforce-eager")
    assert "check the quotes" in refused(checks.command_line("--vllm-cmd"), "'vllm serve")
    assert checks.name_list(" a, b,,") == ("a", "b")


@pytest.mark.parametrize("text, expected", [("ttft,tpot", ("ttft", "tpot")),
                                            (" e2el , itl ,", ("e2el", "itl"))])
def test_percentile_metrics_parse(text, expected) -> None:
    assert checks.percentile_metrics(text) == expected


@pytest.mark.parametrize("text", ["", "ttft,queue", "client_queue_time", ","])
def test_percentile_metrics_refuse_what_a_closed_loop_does_not_measure(text) -> None:
    with pytest.raises(ConfigError, match="--percentile-metrics .*Choose from ttft,tpot,itl,e2el"):
        checks.percentile_metrics(text)


def test_metric_percentiles_parse_and_refuse() -> None:
    assert checks.metric_percentiles("50,90,99,99.9") == (50.0, 90.0, 99.0, 99.9)
    for bad in ("", "0", "101", "nan", "ninety", "50,-1"):
        with pytest.raises(ConfigError, match="--metric-percentiles .*e.g. --metric-percentiles"):
            checks.metric_percentiles(bad)


# --- the engine: what tuner.api resolves, with the machine's answers handed in ---------------
def test_the_embedded_default_takes_the_cpu_engines_flags_without_a_gpu():
    spec = checks.engine_spec(EngineOptions(extra_args=("--max-num-seqs", "8")), gpu=False,
                              embedded_model="/cache/smollm2")
    assert spec.model == "/cache/smollm2" and spec.model_name == engine_cmdline.EMBEDDED_HUB_ID
    assert spec.extra_args == (*checks.CPU_DEFAULT_ARGS, "--max-num-seqs", "8")
    assert spec.device == "cpu" and spec.env == checks.CPU_ENV
    on_gpu = checks.engine_spec(EngineOptions(env={"A": "1"}), gpu=True,
                                embedded_model="/cache/smollm2")
    assert on_gpu.extra_args == () and on_gpu.env == {"A": "1"} and on_gpu.device == "cuda"


def test_the_users_model_is_checked_and_resolved(tmp_path):
    spec = checks.engine_spec(EngineOptions(model=str(tmp_path), tokenizer="t"), gpu=False,
                              embedded_model=None)
    assert spec.model == str(tmp_path.resolve()) and spec.model_name == str(tmp_path)
    assert spec.extra_args == () and spec.tokenizer == "t"
    assert "Model path '/no/such' does not exist" in refused(
        checks.engine_spec, EngineOptions(model="/no/such"), gpu=False, embedded_model=None)
    hub = checks.engine_spec(EngineOptions(model="org/name"), gpu=True, embedded_model=None)
    assert hub.model == "org/name"


def test_a_running_server_refuses_the_options_that_launch_one():
    checks.live_engine_options(EngineOptions(base_url="http://h:1"))
    m = refused(checks.live_engine_options, EngineOptions(
        base_url="http://h:1", vllm_cmd=("vllm", "serve"), env={"A": "1"}))
    assert "--base-url http://h:1 with --vllm-cmd, --engine-env" in m
    # bench carries --engine-env in its config: refused there, named the same.
    live = EngineSpec(model="m", base_url="http://h:1")
    m = refused(checks.bench_options, BenchOptions(
        workload=WorkloadSpec(name="random"), engine=live, out_dir=Path("b"),
        config=TrialConfig(engine_env={"A": "1"})), live)
    assert "--base-url http://h:1 with --engine-env: a running server keeps" in m


# --- an options record resolved ----------------------------------------------------------------
def test_optimize_options_fill_the_defaults_that_follow_from_the_engine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    engine = EngineSpec(model="/models/llama-3", vllm_cmd=("serve",))
    given = OptimizeOptions(workload=WorkloadSpec(name="sharegpt"), engine=EngineOptions(),
                            settings=MeasureSettings(concurrencies=(2, 4)),
                            aligned_baseline=AlignedBaselineFlags(engine_args="--no-x"))
    got = checks.optimize_options(given, engine)
    assert got.engine == engine and got.study_name == "sharegpt-llama-3"
    assert got.out_dir == Path("outputs") / "sharegpt-llama-3" and not got.out_dir.exists()
    assert got.target_concurrency == 2
    assert got.aligned_baseline == TrialConfig(engine_args={"no_x": True})
    assert got.options is given  # what the user asked for, kept beside what was resolved
    m = refused(checks.optimize_options, OptimizeOptions(
        workload=WorkloadSpec(name="random"), out_dir=tmp_path,
        policy=PolicyOptions(ladder=(1, 16))), _engine("--max-num-seqs", "8"))
    assert "--ladder 16: above the engine's --max-num-seqs 8" in m


# --- engine args ----------------------------------------------------------------------------
@pytest.mark.parametrize("args, want", [
    (("--max-model-len", "4096"), 4096), (("--max-model-len=8k",), 8000),
    (("--max-model-len", "2K"), 2048), (("--enforce-eager",), None),
    (("--max-model-len", "auto"), None), (("--max-model-len", "-1"), None),
    (("--max-model-len", "1", "--max-model-len", "64"), 64),
])
def test_max_model_len_is_read_as_vllm_reads_it(args, want):
    assert engine_cmdline.read_engine_args(args).get("max_model_len") == want


def _engine(*args: str) -> EngineSpec:
    # A --vllm-cmd of its own: the fallback reader, not vLLM's parser (tests/unit/test_commands).
    return EngineSpec(model="m", vllm_cmd=("serve",), extra_args=args)


def test_a_level_above_max_num_seqs_is_refused_with_both_ways_out():
    checks.check_levels_fit_engine((1, 8), _engine("--max-num-seqs", "8"))
    checks.check_levels_fit_engine((1, 512), _engine())  # unknown: vLLM's default applies
    m = refused(checks.check_levels_fit_engine, (1, 16), _engine("--max-num-seqs=8"))
    assert "--concurrency 16" in m and "--max-num-seqs 8" in m and "queueing" in m
    assert "raise --max-num-seqs" in m


def test_requests_per_trial_are_bounded():
    checks.check_requests(MeasureSettings(concurrencies=(1, 8, 4096)), 16)
    m = refused(checks.check_requests,
                MeasureSettings(concurrencies=(4096,), requests_per_slot=1000,
                                sample_prompts=0), 16)
    assert "4100096 requests per trial" in m and "at most 100000" in m


def test_open_files_are_raised_to_the_hard_limit_or_refused(monkeypatch):
    calls = []
    monkeypatch.setattr(resource, "setrlimit", lambda which, lim: calls.append(lim))
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 65536))
    checks.ensure_open_files(4096)
    assert calls == [(4096 + checks.OPEN_FILES_SPARE, 65536)]
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 2048))
    m = refused(checks.ensure_open_files, 4096)
    assert "--concurrency 4096" in m and "only 2048" in m and "ulimit -n" in m


# --- output folder --------------------------------------------------------------------------
def test_output_dir_is_created_and_left_without_a_probe(tmp_path):
    out = checks.output_dir(tmp_path / "a" / "b")
    assert out.is_dir() and list(out.iterdir()) == []


def test_output_dir_that_is_a_file_or_under_one(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    assert "is a file, not a folder" in refused(checks.output_dir, f)
    assert "cannot create the folder" in refused(checks.output_dir, f / "sub")


def test_output_dir_that_cannot_be_written(tmp_path):
    if os.geteuid() == 0:  # root writes through permission bits; sysfs refuses even root
        ro = Path("/sys")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
    m = refused(checks.output_dir, ro)
    assert f"'{ro}': cannot write in it" in m and "pass a folder you can write" in m


def test_output_dir_on_a_full_disk(tmp_path, monkeypatch):
    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    m = refused(checks.output_dir, tmp_path)
    assert "No space left on device" in m and "free space" in m
    assert not any(tmp_path.iterdir())  # the probe is gone


# --- dataset files --------------------------------------------------------------------------
def test_dataset_path_that_is_no_regular_file(tmp_path):
    assert "is a directory" in refused(workloads.read_rows, tmp_path)
    assert "is a device" in refused(workloads.read_rows, Path("/dev/zero"))
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    assert "is a pipe" in refused(workloads.read_rows, fifo)  # and did not block
    assert "does not exist" in refused(workloads.read_rows, tmp_path / "none.jsonl")


def test_dataset_file_and_line_size_limits(tmp_path, monkeypatch):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "x" * 300}) + "\n" + json.dumps({"prompt": "y"}))
    monkeypatch.setattr(checks.files, "DATASET_MAX_LINE_BYTES", 200)
    m = refused(workloads.read_rows, path)
    assert "line 1 is longer than" in m
    monkeypatch.setattr(checks.files, "DATASET_MAX_LINE_BYTES", 1 << 20)
    monkeypatch.setattr(checks.files, "DATASET_MAX_BYTES", 100)
    assert "above the" in refused(workloads.read_rows, path)


def test_jsonl_lines_are_read_as_before(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a"}\r\n\n{"prompt": "b"}\r{"prompt": "c"}')
    assert [r["prompt"] for r in workloads.read_rows(path)] == ["a", "b", "c"]
    path.write_bytes(b'{"prompt": "a"}\n\xff\n')
    assert "line 2 is not UTF-8" in refused(workloads.read_rows, path)


def _custom(tmp_path: Path, prompts: list[str]) -> WorkloadSpec:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return WorkloadSpec(name="custom", dataset_path=str(path), num_prompts=len(prompts),
                        output_len=16, skip_chat_template=True)


def test_prompts_beyond_the_context_are_skipped_with_a_count(tmp_path):
    spec = _custom(tmp_path, ["short one", "word " * 400, "another short", "w " * 5_000_000])
    said: list[str] = []
    wl = workloads.load(spec, tokenizer=TOK, max_model_len=128, say=said.append)
    assert sorted(p.prompt for p in wl.prompts) == ["another short", "short one"]
    assert said == ["Skipped 2 prompt(s) that do not fit the model's context of 128 tokens "
                    "(prompt + output; --max-model-len); 2 kept."]
    assert all(p.prompt_len + p.output_len <= 128 for p in wl.prompts)


def test_no_prompt_fitting_the_context_is_refused(tmp_path):
    spec = _custom(tmp_path, ["word " * 400])
    m = refused(workloads.load, spec, tokenizer=TOK, max_model_len=64)
    assert "none of its prompts fits the model's context of 64 tokens" in m
    assert "--max-model-len" in m
    m = refused(workloads.load, WorkloadSpec(name="random", num_prompts=2, random_input_len=100),
                tokenizer=TOK, max_model_len=64)
    assert "(2 skipped)" in m


def test_counting_a_long_text_in_pieces_matches_one_call():
    tok = workloads.load_tokenizer(TOK)
    text = " ".join(f"word{i % 97} = value_{i % 13}({i})" for i in range(20_000))
    assert len(text) > 3 * workloads.PIECE_CHARS
    assert workloads.count_tokens(tok, text, limit=10**9) == len(tok(text).input_ids)
    assert workloads.count_tokens(tok, text, limit=100) < len(tok(text).input_ids)


# --- search-space values ------------------------------------------------------------------------
@pytest.mark.parametrize("text, where, value", [
    ("methods: {ngram: {num_speculative_tokens: .nan}}", "methods.ngram.num_speculative_tokens",
     "nan"),
    ("methods: {ngram: {num_speculative_tokens: 3, prompt_lookup_max: 1e300}}",
     "methods.ngram.prompt_lookup_max", "1e300"),  # YAML 1.1 reads it as text
    ("methods: {ngram: {num_speculative_tokens: 65}}", "methods.ngram.num_speculative_tokens",
     "65"),
    ("methods: {ngram: {num_speculative_tokens: {type: int, low: 0, high: 4}}}",
     "methods.ngram.num_speculative_tokens.low", "0"),
    ("methods: {ngram: {prompt_lookup_min: {type: choice, values: [1, 0]}}}",
     "methods.ngram.prompt_lookup_min.values[1]", "0"),
    ("methods: {suffix: {suffix_decoding_max_spec_factor: .inf}}",
     "methods.suffix.suffix_decoding_max_spec_factor", "inf"),
    ("methods: {ngram: {}}\nengine: {max_num_batched_tokens: 1.0e+300}",
     "engine.max_num_batched_tokens", "1e+300"),
    ("methods: {ngram: {}}\nstart_points: [{method: ngram, num_speculative_tokens: .nan}]",
     "start_points[0].num_speculative_tokens", "nan"),
])
def test_space_values_must_be_finite_and_sane(tmp_path, text, where, value):
    path = tmp_path / "s.yaml"
    path.write_text(text + "\n")
    m = refused(space.load, str(path))
    assert m.startswith(f"{path}: {where}: {value}: must be "), m
    assert m.endswith("Fix the value in the file.")


def test_shipped_spaces_are_within_the_bounds():
    for name in space.available():
        space.load(name)
    assert math.isfinite(space_values.ANY_NUMBER.high)


# --- --speculative-config: methods and keys as vLLM's SpeculativeConfig names them ------------
DFLASH = '{"method": "dflash", "model": "/models/dflash-head", "num_speculative_tokens": 4}'


@pytest.fixture(params=["installed", "fallback"])
def schema_source(request, monkeypatch):
    """Each check runs against the installed vLLM's SpeculativeConfig and against spec-tuner's
    copy of vLLM 0.32.0's (what an engine in another virtualenv gets)."""
    import importlib.util

    from tuner.speculative import schema

    if request.param == "installed" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python")
    if request.param == "fallback":
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    schema.vllm_schema.cache_clear()
    yield schema.vllm_schema()
    schema.vllm_schema.cache_clear()


def test_methods_vllm_accepts_pass_though_tuner_has_no_entry_for_them(schema_source):
    assert "dflash" not in checks.METHODS  # the descriptions; not what is checked
    assert checks.speculative_config(DFLASH) == json.loads(DFLASH)
    for method in ("deepseek_mtp", "qwen3_next_mtp", "ngram"):
        assert checks.speculative_config(json.dumps({"method": method}))["method"] == method
    # vLLM reads `-` as `_` in the keys
    assert checks.speculative_config('{"method": "ngram", "prompt-lookup-max": 3}')


def test_an_unknown_key_is_refused_with_close_matches_and_the_valid_keys(schema_source):
    m = refused(checks.speculative_config, '{"method": "ngram", "prompt_lookup_mx": 4}')
    assert m.startswith("--speculative-config: unknown key 'prompt_lookup_mx'. Did you mean "
                        "'prompt_lookup_max' or 'prompt_lookup_min'? Valid (")
    assert schema_source.origin in m and "suffix_decoding_max_tree_depth, " in m
    assert m.endswith("Fix the key; vLLM would refuse the config at start-up.")


@pytest.mark.parametrize("text, fragments", [
    ('{"method": "dflsh"}', ["--speculative-config: unknown method 'dflsh'. Did you mean "
                             "'dflash'?", "qwen3_next_mtp", "--speculative-config none"]),
    ('{"method": "none"}', ["unknown method 'none'", "use --speculative-config none for the "
                            "baseline"]),
    ('{"method": ["ngram"]}', ["unknown method ['ngram']. Valid ("]),
    ('{"num_speculative_tokens": 3}', ['has no "method". Valid (', "Add one, e.g."]),
])
def test_an_unknown_or_missing_method_is_refused(schema_source, text, fragments):
    m = refused(checks.speculative_config, text)
    assert all(f in m for f in fragments), m
    assert schema_source.origin in m


# --- the CLI, in-process, with the api replaced --------------------------------------------------
class Reached(Exception):
    """The api was called: every check passed."""


@pytest.fixture
def no_api(monkeypatch):
    """The api's entry points record the options record the command line built."""
    def record(options, **_kwargs):
        raise Reached(options)

    for name in ("bench", "optimize_and_report", "policy"):
        monkeypatch.setattr(api, name, record)


@pytest.fixture
def no_stage(monkeypatch):
    """The first stage after every check (loading the workload) is never reached for real:
    what tuner.api checks as it resolves the options runs, nothing is launched."""
    def record(*args, **kwargs):
        raise Reached(args, kwargs)

    monkeypatch.setattr(workloads, "load", record)


def main(capsys, *argv: str) -> tuple[int | None, str]:
    try:
        rc = cli.main(list(argv))
    except Reached:
        rc = None
    return rc, capsys.readouterr().err


def test_cli_refuses_a_nan_timeout_in_one_line(no_api, capsys, tmp_path):
    rc, err = main(capsys, "bench", "--model", TOK, "--request-timeout", "nan",
                   "--output-dir", str(tmp_path / "b"))
    assert rc == 2 and err.splitlines() == [
        "tuner: error: " + refused(checks.check, "request_timeout", "nan")]
    assert not (tmp_path / "b").exists()  # refused before anything was created


@pytest.mark.parametrize("argv, fragment", [
    (["--concurrency", "16", "--engine-args", "--max-num-seqs 8"], "--max-num-seqs 8"),
    (["--concurrency", "100000"], "from 1 to 4096"),
    (["--output-dir", "{file}"], "is a file, not a folder"),
    (["--workload", "custom", "--dataset-path", "/dev/zero"], "is a device"),
    (["--workload", "custom", "--dataset-path", "{dir}"], "is a directory"),
    (["--num-requests", "100000", "--concurrency", "1,2"], "requests per trial"),
])
def test_cli_cross_checks_exit_2_before_a_stage_runs(no_stage, capsys, tmp_path, argv,
                                                    fragment):
    (tmp_path / "file").write_text("x")
    argv = [a.replace("{file}", str(tmp_path / "file")).replace("{dir}", str(tmp_path))
            for a in argv]
    out = [] if "--output-dir" in argv else ["--output-dir", str(tmp_path / "o")]
    for command in ("bench", "optimize"):
        rc, err = main(capsys, command, "--model", TOK, *argv, *out)
        assert rc == 2 and len(err.splitlines()) == 1 and fragment in err, err


def test_cli_bench_takes_any_method_vllm_has_and_refuses_an_unknown_key(no_api, capsys,
                                                                       tmp_path):
    with pytest.raises(Reached) as e:
        cli.main(["bench", "--model", TOK, "--speculative-config", DFLASH,
                  "--output-dir", str(tmp_path / "b")])
    assert e.value.args[0].config.speculative_config == json.loads(DFLASH)
    rc, err = main(capsys, "bench", "--model", TOK, "--speculative-config",
                   '{"method":"ngram","prompt_lookup_mx":4}', "--output-dir", str(tmp_path / "c"))
    assert rc == 2 and len(err.splitlines()) == 1
    assert "unknown key 'prompt_lookup_mx'. Did you mean 'prompt_lookup_max'" in err


def test_cli_optimize_checks_the_policy_ladder_before_the_search(no_stage, capsys, tmp_path):
    rc, err = main(capsys, "optimize", "--model", TOK, "--policy", "--ladder", "1,2,4,16",
                   "--engine-args", "--max-num-seqs 8", "--output-dir", str(tmp_path))
    assert rc == 2 and "--ladder 16: above the engine's --max-num-seqs 8" in err
    rc, err = main(capsys, "optimize", "--model", TOK, "--policy", "--ladder", "4,2",
                   "--output-dir", str(tmp_path))
    assert rc == 2 and "--ladder '4,2' must rise" in err


def test_cli_values_within_bounds_reach_the_api(no_api, capsys, tmp_path):
    with pytest.raises(Reached) as e:
        cli.main(["optimize", "--model", TOK, "--request-timeout", "0.5", "--concurrency",
                  "1,4096", "--n-trials", "10000", "--temperature", "2", "--max-tpot-ms", "1e-3",
                  "--output-dir", str(tmp_path / "s")])
    options = e.value.args[0]
    assert options.engine.request_timeout_s == 0.5 and options.n_trials == 10000
    assert options.settings.concurrencies == (1, 4096) and options.workload.temperature == 2.0
    assert options.constraints["max_tpot_ms"] == 0.001
    assert capsys.readouterr().err.count("tuner: error") == 0


def test_the_workload_names_checked_are_the_workloads_built():
    # settings refuses unknown names before a tokenizer loads; the builders live in workloads.
    assert checks.WORKLOADS == tuple(workloads.names())
    assert "Available: instructcoder" in refused(checks.workload_name, "instrctcoder")
