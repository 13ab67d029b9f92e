"""The evaluation harness (benchmarks/) as a user runs it: each script by its command line,
never imported. benchmarks/README.md lists every script and every stored data set; the
analyses docs/ quotes come out of the stored data as stored."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
README = (BENCH / "README.md").read_text()
# Modules of noise_sources.py, with no command line of their own.
MODULES = {"noise_probes.py", "noise_covariates.py"}
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _readme_section(title: str) -> str:
    return README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_readme_lists_every_script_with_its_question_command_and_data():
    rows = {m[1]: m[0] for m in re.finditer(r"^\| `(\w+\.py)`.*$", _readme_section("Scripts"),
                                            re.M)}
    listed = set(re.findall(r"`(\w+\.py)`", _readme_section("Scripts")))
    assert listed == set(SCRIPTS), f"not in the README: {set(SCRIPTS) - listed}; " \
                                   f"gone from benchmarks/: {listed - set(SCRIPTS)}"
    for name, row in rows.items():
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and all(cells), f"{name}: question, command and data, each"
        if name not in MODULES:
            assert f"benchmarks/{name}" in cells[2] or "scripts/" in cells[2], \
                f"{name}: its command"


def test_every_stored_set_is_in_the_readme_and_every_dropped_one_is_gone_with_its_commit():
    stored = _readme_section("Stored data sets")
    for path in sorted({*BENCH.joinpath("data").glob("*"), *BENCH.joinpath("data").glob("h*/*")}):
        if path.is_dir() and path.name not in ("h100", "h200"):
            name = path.relative_to(BENCH).as_posix()
            short = path.name
            assert name in stored or f"`{short}`" in stored or f", {short}" in stored, \
                f"{name} is stored but benchmarks/README.md does not say who reads it"
    dropped = _readme_section("Dropped, and how to re-measure")
    commit = re.search(r"commit `([0-9a-f]{7,40})`", dropped)[1]
    first_cells = re.findall(r"^\| (`[^|]+)\|", dropped, re.M)
    names = [n for cell in first_cells for n in re.findall(r"`([^`]+)`", cell)
             if n.startswith("data/") or n.endswith(".py")]
    assert names, "no dropped set listed"
    for name in names:
        assert not (BENCH / name).exists(), f"{name} is listed as dropped but still here"
        path = f"benchmarks/{name.rstrip('/')}"
        kept = subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT,
                              capture_output=True)
        assert kept.returncode == 0, f"{path} is not in commit {commit}"


@pytest.mark.parametrize("script", sorted(set(SCRIPTS) - MODULES))
def test_every_script_states_its_command_line(script):
    r = run(f"benchmarks/{script}", "--help", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"usage: {script}"), r.stdout[:300]


def test_noise_sources_analyze_prints_the_stored_tables_again():
    stored = BENCH / "data" / "h100" / "noise-16p-3launches"
    r = run("benchmarks/noise_sources.py", "analyze", str(stored.relative_to(ROOT)))
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.splitlines()
    # Every line the run stored comes out again, in order (later versions add lines).
    at = 0
    for line in (stored / "tables.txt").read_text().splitlines():
        assert line in out[at:], f"no longer printed: {line!r}"
        at = out.index(line, at) + 1
    assert "c=32: 3 launches x 2 repeats, mean 8759.7 tok/s" in r.stdout
    assert r.stdout.count("engine processes and GPU: not recorded in these measurements") == 3


def test_draft_candidates_table_is_the_one_method_md_quotes():
    stored = BENCH / "data" / "cpu-draft" / "candidates-16p.json"
    r = run("benchmarks/draft_candidates.py", "--table", str(stored.relative_to(ROOT)))
    assert r.returncode == 0, r.stderr[-2000:]
    method = (ROOT / "docs" / "method.md").read_text()
    rows = r.stdout.strip().splitlines()
    assert len(rows) > 3 and all(row in method for row in rows), r.stdout
    assert "| `skip2-7` | 24/30 |" in r.stdout  # the drafter tuner.measure.model makes


@pytest.mark.vllm  # the replay steps vLLM's n-gram proposer
def test_sampled_acceptance_analyze_gives_the_figures_method_md_quotes(tmp_path):
    stored = BENCH / "data" / "h100" / "sampled-acceptance-32p"
    csv = tmp_path / "rows.csv"
    r = run("benchmarks/sampled_acceptance.py", "analyze", str(stored.relative_to(ROOT)),
            "--csv", str(csv))
    assert r.returncode == 0, r.stderr[-2000:]
    expected = (stored / "analysis.txt").read_text()
    rows_line = re.compile(r"^rows: .*$", re.M)
    assert rows_line.sub("", r.stdout) == rows_line.sub("", expected)
    assert csv.read_text() == (stored / "sampled_acceptance.csv").read_text()
    method = (ROOT / "docs" / "method.md").read_text()
    assert "in 72 of 80 cases" in method and "held at temperature > 0: 72/80" in r.stdout
    assert "median error 3.1%, worst 17.0%" in method
    assert "|error| median 3.1%, max 17.0% over 80 rows" in r.stdout


def test_drafter_k_analyze_gives_the_stored_predictions_again(tmp_path):
    stored = BENCH / "data" / "cpu-drafter-k" / "skip2-7-8p-64t"
    csv = tmp_path / "rows.csv"
    r = run("benchmarks/drafter_k.py", "analyze", str(stored.relative_to(ROOT)), "--csv", str(csv))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == (stored / "analysis.txt").read_text()
    assert csv.read_text() == (stored / "predicted_vs_measured.csv").read_text()
