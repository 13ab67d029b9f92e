"""Isolation: what a trial exposes and what a crash can damage.

The engine listens on loopback only and refuses API calls without the per-trial key; no
command line goes through a shell, so a model path with spaces, quotes and `;` reaches the
engine as one intact argument; text from models, prompts and engine logs is escaped in
report.html; and a crash in the middle of writing result.json or recommendation.json leaves
the previous file whole.
"""

from __future__ import annotations

import ast
import json
import os
import re
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import _PYTHONPATH
from study_fakes import add_failed, fake_level, realistic_study

import tuner
from tuner.api import engines
from tuner.measure.engine import Engine
from tuner.outputs import files
from tuner.records.configs import TrialConfig
from tuner.records.options import EngineOptions
from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
from tuner.testing.fake_script import SCRIPT_ENV

EVIL = "<script>alert('x')</script>"


def _request(url: str, *, key: str | None = None, body: dict | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                    timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# --- network -----------------------------------------------------------------------------------
def _listeners(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} writes them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(addr)
    return found


def _outside_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback."""
    try:
        import psutil

        return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                if a.family == socket.AF_INET and not a.address.startswith("127.")]
    except ImportError:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect(("192.0.2.1", 9))  # no packet is sent for UDP connect
                addr = s.getsockname()[0]
            except OSError:
                return []
        return [] if addr.startswith("127.") else [addr]


def test_engine_listens_on_loopback_only(fake_engine):
    with fake_engine() as eng:
        assert eng.url.startswith("http://127.0.0.1:")
        assert _listeners(eng.port) == ["0100007F"], "listening beyond 127.0.0.1"
        for addr in _outside_addresses():
            with socket.socket() as s:
                s.settimeout(3)
                assert s.connect_ex((addr, eng.port)) != 0, f"reachable on {addr}:{eng.port}"
        assert _request(eng.url + "/health") == 200  # and it was up all along


def test_api_refuses_requests_without_the_trial_key(fake_engine):
    body = {"model": "fake", "prompt": "hi", "max_tokens": 2}
    with fake_engine() as eng:
        assert _request(eng.url + "/v1/completions", body=body) == 401
        assert _request(eng.url + "/v1/completions", body=body, key="tuner-guess") == 401
        assert _request(eng.url + "/v1/models") == 401
        assert _request(eng.url + "/v1/models", key=eng.api_key) == 200
        assert _request(eng.url + "/v1/completions", body=body, key=eng.api_key) == 200
    other = Engine(eng.spec, TrialConfig(), log_path=eng.log_path)
    assert other.api_key != eng.api_key and len(eng.api_key) >= 32  # per trial, random


# --- no shell anywhere -------------------------------------------------------------------------
SHELL_CALLS = re.compile(r"shell\s*=\s*True|os\.system\s*\(|os\.popen\s*\(|"
                         r"subprocess\.getoutput|subprocess\.getstatusoutput")


def test_no_shell_in_the_package():
    package = Path(tuner.__file__).parent
    hits = [f"{p.relative_to(package)}:{n}: {line.strip()}"
            for p in sorted(package.rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if SHELL_CALLS.search(line)]
    assert not hits, hits


def test_model_path_with_shell_characters_reaches_the_engine_intact(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "my model \"v2\" it's; touch pwned && echo $(touch pwned2) `touch pwned3` | x"
    model = tmp_path / name
    model.mkdir()
    spec = engines.resolve_engine(EngineOptions(
        model=str(model), vllm_cmd=(sys.executable, "-m", "tuner.testing.fake_engine"),
        env={SCRIPT_ENV: json.dumps({"startup_s": 0}), "PYTHONPATH": _PYTHONPATH},
        ready_timeout_s=15.0))
    assert spec.model == str(model)
    with Engine(spec, TrialConfig(), log_path=tmp_path / "engine.log") as eng:
        assert _request(eng.url + "/health") == 200
    logged = re.search(r"args: model=(.*) ignored=", (tmp_path / "engine.log").read_text())
    assert logged, "the fake engine did not log its arguments"
    assert ast.literal_eval(logged.group(1)) == str(model)  # one argument, byte for byte
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("pwned")]


# --- escaping in the report --------------------------------------------------------------------
def test_report_html_escapes_script_in_a_model_name_and_a_prompt(tmp_path):
    from tuner.api import write_report as write_outputs

    study = realistic_study(model=f"org/{EVIL}")  # a hub id is shown whole in the title
    # A server error that echoes the prompt reaches the report through the failure reason.
    add_failed(study, {"method": "ngram", "num_speculative_tokens": 2}, kind="measurement_failed",
               reason=f"c=1: 3 of 3 requests failed (first error: HTTP 400: prompt '{EVIL}' "
                      f"is longer than the model's context)",
               log_tail=f"ERROR prompt={EVIL!r}\n<img src=x onerror=alert(1)>")
    paths = write_outputs(study, tmp_path)
    page = paths["report_html"].read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert "org/&lt;script&gt;" in page  # the model, escaped, still readable
    assert "prompt &#x27;&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&#x27;" in page
    # Markdown: code fences show text verbatim (renderers escape them); elsewhere it is escaped.
    md = re.sub(r"```.*?```", "", paths["report_md"].read_text(), flags=re.S)
    assert "<script" not in md.lower()


# --- atomic writes ----------------------------------------------------------------------------
class SimulatedCrash(BaseException):
    """The process dies here (BaseException: no `except Exception` may swallow it)."""


def _result(tput: float) -> BenchResult:
    level = LevelMetrics.model_validate(fake_level(1, output_throughput=tput, mean_tpot_ms=20.0))
    return BenchResult(config=TrialConfig(), engine=EngineInfo(start_s=1.0), levels=(level,))


def _crash(*_args, **_kwargs):
    raise SimulatedCrash("killed mid-write")


def _half_write(self, data, *args, **kwargs):
    """Write half of the data to the file, then die: a torn write."""
    with open(self, "w") as f:
        f.write(data[: len(data) // 2])
    raise SimulatedCrash("killed mid-write")


@pytest.mark.parametrize("where", ["os.replace", "write"])
def test_a_crash_mid_write_leaves_the_previous_result_json(tmp_path, monkeypatch, where):
    path = tmp_path / "result.json"
    files.write_json(path, {"wall_s": 1.0, **json.loads(_result(10.0).model_dump_json())})
    before = path.read_text()
    if where == "os.replace":
        monkeypatch.setattr(os, "replace", _crash)
    else:
        monkeypatch.setattr(Path, "write_text", _half_write)
    with pytest.raises(SimulatedCrash):
        files.write_json(path, {"wall_s": 2.0, **json.loads(_result(99.0).model_dump_json())})
    monkeypatch.undo()
    assert path.read_text() == before
    assert json.loads(before)["levels"][0]["output_throughput"] == 10.0


@pytest.mark.parametrize("where", ["os.replace", "write"])
def test_a_crash_mid_write_leaves_the_previous_recommendation_json(tmp_path, monkeypatch, where):
    from tuner.api import write_report as write_outputs

    study = realistic_study()
    write_outputs(study, tmp_path)
    before = {name: (tmp_path / name).read_text()
              for name in ("recommendation.json", "report.html", "trials.csv")}
    add_failed(study, {"method": "ngram", "num_speculative_tokens": 9}, reason="changed")
    if where == "os.replace":
        monkeypatch.setattr(os, "replace", _crash)
    else:
        monkeypatch.setattr(Path, "write_text", _half_write)
    with pytest.raises(SimulatedCrash):
        write_outputs(study, tmp_path)
    monkeypatch.undo()
    for name, text in before.items():
        assert (tmp_path / name).read_text() == text, f"{name} was damaged"
    doc = json.loads(before["recommendation.json"])
    assert doc["trials"]["fail"] == 1  # the previous content, whole
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left beside the outputs"
