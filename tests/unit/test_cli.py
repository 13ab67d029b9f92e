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
