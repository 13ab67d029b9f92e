"""The CLI in this process (cli.main): what each flag reaches the api as, and bad input as one
clear message naming the bad value, exit status 2, no traceback. The real console entry in a
subprocess: tests/integration/test_cli_process.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.measure.workloads import EMBEDDED_TOKENIZER

TOK = str(EMBEDDED_TOKENIZER)  # a folder with tokenizer files stands in for a model here


def _bad_jsonl(tmp_path: Path) -> str:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "hello"}\n{"prompt": "hi"\n')
    return str(p)


@pytest.mark.parametrize(("argv", "strategy", "sampler"), [
    ([], "auto", "tpe"),
    (["--sampler", "random"], "optuna", "random"),  # a named sampler asks for Optuna
    (["--strategy", "replay", "--sampler", "grid"], "replay", "grid"),
    (["--strategy", "optuna"], "optuna", "tpe"),
])
def test_the_strategy_the_command_line_asks_for(monkeypatch, tmp_path, argv, strategy, sampler):
    from tuner import api, cli
    from tuner.records.outcomes import StudyOutcome

    seen = []

    def fake(options, **_kwargs):
        seen.append(options)
        return StudyOutcome(study_name="s", out_dir=tmp_path)

    monkeypatch.setattr(api, "optimize_and_report", fake)
    rc = cli.main(["-q", "optimize", "--model", TOK, "--output-dir", str(tmp_path / "o"),
                   "--no-report", *argv])
    assert rc == 0
    assert (seen[0].strategy, seen[0].sampler) == (strategy, sampler)


# --- CLI habits (issue 15) and engine-argument strings (issue 16) ----------------------------
class Reached(Exception):
    """The api was called with this options record and these keyword arguments: every check
    made as the command line was parsed passed."""


@pytest.fixture
def api_calls(monkeypatch):
    """Replace the api's entry points by a recorder: call(*argv) returns the options record
    and the keyword arguments the CLI's one api call passed."""
    from tuner import api

    def record(options, **kwargs):
        raise Reached(options, kwargs)

    for name in ("bench", "optimize_and_report", "policy"):
        monkeypatch.setattr(api, name, record)

    def call(*argv: str) -> tuple:
        from tuner import cli

        with pytest.raises(Reached) as e:
            cli.main(list(argv))
        return e.value.args

    return call


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


def test_verbose_shows_tuners_debug_lines_and_only_then(monkeypatch, capsys, tmp_path):
    import logging

    from tuner import cli
    from tuner.measure import workloads

    def load(*args, **kwargs):  # the first stage after every check: the engine is resolved
        logging.getLogger("tuner.measure.engine").debug("starting vLLM: x")
        raise Reached(args, kwargs)

    monkeypatch.setattr(workloads, "load", load)
    argv = ["bench", "--model", TOK, "--output-dir", str(tmp_path / "b")]
    with pytest.raises(Reached):
        cli.main([*argv, "-v"])
    err = capsys.readouterr().err.splitlines()
    assert "tuner: debug: starting vLLM: x" in err
    assert any(line.startswith(f"tuner: debug: engine: model {TOK}") for line in err)
    with pytest.raises(Reached):  # and a later run without -v is quiet again
        cli.main(argv)
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
                yield name, action, cli.arguments.HelpFormatter("tuner")._get_help_string(action)


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
    from tuner.search.samplers import SAMPLERS
    from tuner.search.space import available

    assert cli.api.names() == {"spaces": tuple(available()), "samplers": tuple(SAMPLERS),
                               "objectives": tuple(OBJECTIVES)}
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
    options, _ = api_calls("bench", "--model", TOK, "--output-dir", str(tmp_path / "b"),
                           "--vllm-cmd", "vllm serve", *argv)
    assert options.engine.extra_args == extra_args


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
    from tuner import api
    from tuner.records.configs import TrialConfig

    options, _ = api_calls("optimize", "--model", TOK, "--output-dir", str(tmp_path / "o"),
                           *argv)
    got = api.resolve_optimize(options).aligned_baseline  # what the search is handed
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
    assert api_calls(*base, "--ladder-max", "8")[0].policy.ladder_max == 8
    assert "warning" not in capsys.readouterr().err
    assert api_calls(*base, "--max-concurrency", "4")[0].policy.ladder_max == 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        "tuner: warning: --max-concurrency is now --ladder-max (the top of the policy ladder;")


@pytest.mark.parametrize("argv, dest, value, old", [
    (["predict", "x", "--levels", "1,8"], "levels", (1, 8), None),
    (["predict", "x", "--concurrency", "1,8"], "levels", (1, 8), "--concurrency is now --levels"),
    (["predict", "x"], "levels", None, None),
    (["recommend", "x", "--level", "8"], "level", 8, None),
    (["recommend", "x", "--concurrency", "8"], "level", 8, "--concurrency is now --level"),
])
def test_concurrency_means_the_levels_to_measure_and_the_old_spellings_still_work(
        argv, dest, value, old):
    from tuner import cli

    args = cli.build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    notes = [line for _, line in getattr(args, "deprecated", [])]
    assert (notes[0].startswith(old) and "the old name still works" in notes[0]) if old \
        else not notes


def test_with_traffic_concurrency_names_the_levels_to_replay_and_warns_of_nothing(
        capsys, tmp_path):
    from tuner import cli

    missing = tmp_path / "none.jsonl"
    assert cli.main(["predict", "--traffic", str(missing), "--concurrency", "1,8"]) == 2
    err = capsys.readouterr().err
    assert "warning" not in err and str(missing) in err  # the file's own error, alone
    assert cli.main(["predict", str(tmp_path), "--concurrency", "1"]) == 2
    assert "tuner: warning: --concurrency is now --levels" in capsys.readouterr().err


def test_recommend_takes_its_level_under_either_name(capsys, tmp_path):
    import shutil

    from tuner import cli

    study = tmp_path / "study"
    shutil.copytree(Path(__file__).parent.parent / "data" / "old_study_grid", study)
    assert cli.main(["recommend", str(study), "--level", "1", "--json"]) == 0
    new = capsys.readouterr()
    assert cli.main(["recommend", str(study), "--concurrency", "1", "--json"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and new.err == ""
    # The figures and the words, as recommendation.json holds each level.
    assert {"verdict", "reason", "confidence"} <= set(json.loads(new.out))
    assert old.err.startswith("tuner: warning: --concurrency is now --level")
    assert cli.main(["recommend", str(study), "--level", "3"]) == 2
    assert "--level 3: the study measured" in capsys.readouterr().err


def test_num_warmups_metadata_and_disable_tqdm_reach_the_api(api_calls, tmp_path):
    options, kw = api_calls("bench", "--model", TOK, "--output-dir", str(tmp_path / "b"),
                            "--concurrency", "1,4", "--num-warmups", "0", "--metadata",
                            "gpu=H200", "run = 3", "--metadata", "note=a=b", "--disable-tqdm")
    assert options.settings.num_warmups == 0 and kw["show_bar"] is False
    assert options.metadata == {"gpu": "H200", "run": "3", "note": "a=b"}
    # Without --num-warmups: one warm-up per slot, as before.
    options, _ = api_calls("bench", "--model", TOK, "--output-dir", str(tmp_path / "b"),
                           "--concurrency", "1,4")
    assert options.settings.num_warmups is None and options.metadata == {}
    assert [options.settings.warmups_for(c) for c in (1, 4)] == [1, 4]


def test_engine_env_is_part_of_the_benched_config_and_every_engine_of_a_study(api_calls,
                                                                              tmp_path):
    # bench measures one config: what --engine-env sets is part of it (its label, result.json's
    # config.engine_env), not a plain run's. A study keeps it as every engine's environment.
    options, _ = api_calls("bench", "--model", TOK, "--output-dir", str(tmp_path / "b"),
                           "--engine-env", "VLLM_USE_V2_MODEL_RUNNER=0", "--engine-env", "A=1")
    assert options.config.engine_env == {"VLLM_USE_V2_MODEL_RUNNER": "0", "A": "1"}
    assert options.config.label() == "baseline (no speculation) [A=1 VLLM_USE_V2_MODEL_RUNNER=0]"
    assert dict(options.engine.env) == {}
    options, _ = api_calls("optimize", "--model", TOK, "--output-dir", str(tmp_path / "s"),
                           "--engine-env", "A=1")
    assert dict(options.engine.env) == {"A": "1"}


def test_the_output_folder_is_checked_first_and_made_later(tmp_path):
    from tuner import checks

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "f").write_text("x")
    assert checks.output_dir(tmp_path / "kept", keep=False) == tmp_path / "kept"
    assert (tmp_path / "kept" / "f").read_text() == "x"  # a folder that was there stays
    checks.output_dir(tmp_path / "a" / "b" / "c", keep=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # the ones made here go


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


def test_confidence_and_margin_reach_the_search_as_fractions(api_calls, tmp_path, capsys):
    from tuner import cli

    options, _ = api_calls("optimize", "--model", TOK, "--output-dir", str(tmp_path / "o"))
    assert (options.confidence, options.margin) == (0.95, 0.02)
    options, _ = api_calls("optimize", "--model", TOK, "--output-dir", str(tmp_path / "o"),
                           "--confidence", "99", "--margin", "0.5")
    assert options.confidence == pytest.approx(0.99) and options.margin == pytest.approx(0.005)
    for flag, value, fragment in (("--confidence", "100", "between 50 and 99.9"),
                                  ("--margin", "-1", "between 0 and 50"),
                                  ("--confidence", "ninety", "--confidence")):
        out = tmp_path / "bad"
        assert cli.main(["optimize", "--model", TOK, "--output-dir", str(out), flag,
                         value]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err, err
        assert not out.exists()
