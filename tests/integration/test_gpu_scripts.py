"""scripts/gpu_noise.sh and gpu_demo.sh: what reaches the benchmark's command line.

The scripts run on a GPU host with the bundle installed; here a stand-in bundle (a
spec-tuner-env.sh that puts a fake `python3` and `nvidia-smi` first on PATH) records each
python3 command's arguments, one per line, so the test reads exactly what the script passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="the scripts need bash and timeout")


def _site(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in bundle site whose python3 logs its argv (a NUL after each argument, a
    newline after each call) to the returned log file."""
    site, bin_dir, log = tmp_path / "site", tmp_path / "site/bin", tmp_path / "argv.log"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" >> {log}\necho >> {log}\n')
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559 MiB, 580'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    (site / "spec-tuner-env.sh").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    return site, log


def _run(script: str, tmp_path: Path, env: dict[str, str], *args: str
         ) -> subprocess.CompletedProcess[str]:
    site, _ = _site(tmp_path)
    return subprocess.run(["bash", str(REPO / "scripts" / script), *args], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "SITE": str(site), "WORK": str(tmp_path / "work"),
                               "OUT": str(tmp_path / "out"), **env})


def _calls(tmp_path: Path) -> list[list[str]]:
    text = (tmp_path / "argv.log").read_text()
    return [c.split("\0") for c in text.split("\0\n") if c]


def test_noise_engine_args_reach_the_benchmark_as_one_argument(tmp_path: Path) -> None:
    done = _run("gpu_noise.sh", tmp_path, {
        "MODEL": "/shapes/llama3-8b-shaped", "NOISE_ARGS": "--stability 3",
        "ENGINE_ARGS": "--load-format dummy --dtype bfloat16 --max-model-len 4096"}, "120")

    assert done.returncode == 0, done.stdout + done.stderr
    run = next(c for c in _calls(tmp_path) if c[:2] == ["benchmarks/noise_sources.py", "run"])
    assert "--engine-args=--load-format dummy --dtype bfloat16 --max-model-len 4096" in run
    assert run[run.index("--model") + 1] == "/shapes/llama3-8b-shaped"
    assert run[-2:] == ["--stability", "3"]
    assert (tmp_path / "out/gpu-noise.tar.gz").is_file()


def test_noise_without_engine_args_passes_none(tmp_path: Path) -> None:
    done = _run("gpu_noise.sh", tmp_path, {"MODEL": "", "ENGINE_ARGS": "", "NOISE_ARGS": ""},
                "120")

    assert done.returncode == 0, done.stdout + done.stderr
    run = next(c for c in _calls(tmp_path) if c[:2] == ["benchmarks/noise_sources.py", "run"])
    assert "--model" not in run and not any(a.startswith("--engine-args") for a in run)


def test_noise_args_with_quotes_are_refused_with_the_variable_to_use(tmp_path: Path) -> None:
    done = _run("gpu_noise.sh", tmp_path,
                {"NOISE_ARGS": "--engine-args '--load-format dummy'"}, "120")

    assert done.returncode == 2
    assert "ENGINE_ARGS" in done.stderr
    assert not (tmp_path / "argv.log").exists()  # nothing was run


def test_demo_study_gets_model_and_engine_args_whole(tmp_path: Path) -> None:
    done = _run("gpu_demo.sh", tmp_path, {
        "SKIP_A": "1", "TRIAL_S": "10", "MODEL": "/shapes/llama3-8b-shaped",
        "ENGINE_ARGS": "--load-format dummy --dtype bfloat16", "SPACE": "/tmp/draft.yaml",
        "STUDY_DIR": str(tmp_path / "work/draft8b"), "TUNER_ARGS": "--n-trials 2 --policy"},
        "120")

    assert done.returncode == 0, done.stdout + done.stderr
    opt = next(c for c in _calls(tmp_path) if c[:3] == ["-m", "tuner", "optimize"])
    assert "--engine-args=--load-format dummy --dtype bfloat16" in opt
    assert opt[opt.index("--model") + 1] == "/shapes/llama3-8b-shaped"
    assert opt[opt.index("--space") + 1] == "/tmp/draft.yaml"
    assert opt[opt.index("--output-dir") + 1] == str(tmp_path / "work/draft8b")
    assert "--policy" in opt


def test_demo_tuner_args_with_quotes_are_refused(tmp_path: Path) -> None:
    done = _run("gpu_demo.sh", tmp_path,
                {"SKIP_A": "1", "TUNER_ARGS": "--engine-args '--load-format dummy'"}, "120")

    assert done.returncode == 2 and "ENGINE_ARGS" in done.stderr
