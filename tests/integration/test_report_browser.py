"""report.html in a real headless Chromium: it renders the recommendation and the plots.
Skipped with a reason where Chromium is not installed (.ci/run installs Debian's)."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest
from study_fakes import realistic_study

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")


def test_report_renders_recommendation_and_plots_in_chromium(tmp_path):
    from tuner import api

    study = realistic_study()
    paths = api.write_report(study, tmp_path / "study")
    url = paths["report_html"].resolve().as_uri()
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([CHROMIUM, *FLAGS, *profile, "--dump-dom", url], capture_output=True,
                         text=True, timeout=120).stdout
    assert "Recommendation" in dom and "vllm serve" in dom
    assert dom.count("data:image/png;base64,") >= 3
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *FLAGS, *profile, f"--screenshot={shot}",
                    "--window-size=1200,2400", url], capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 2400)
    assert len(data) > 50_000  # a rendered page, not a blank canvas
