"""Shared fixtures: an EngineSpec for the fake engine with a given script, and a running one.

The fake engine (tuner/testing/fake_engine.py) is launched through the real Engine class, so every test
that uses it also exercises process-group start-up, /health polling and teardown.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import tuner
from tuner.measure.engine import Engine
from tuner.records import EngineSpec, Prompt, TrialConfig
from tuner.testing.fake_engine import SCRIPT_ENV

# The fake engine runs as `python -m tuner.testing.fake_engine` in a child process; the checkout must
# be importable there whether or not the package is installed.
_ROOT = str(Path(tuner.__file__).resolve().parent.parent)
_PYTHONPATH = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))

FakeSpec = Callable[..., EngineSpec]


def ctrl_c_delivered() -> None:
    """`preexec_fn` for a driver a test sends Ctrl-C: a test run started in the background
    (`cmd &`, nohup) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
    handler in the child, so the Ctrl-C under test would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _ctrl_c_raises_keyboard_interrupt():
    """The same for tests that Ctrl-C their own process: SIGINT raises KeyboardInterrupt
    during every test, as in a foreground run, whatever the runner inherited."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def fake_engine_spec(**kwargs: object) -> EngineSpec:
    """`fake_engine_spec(ttft_ms=5, stall_requests=True, ready_timeout_s=2)`: script keys go to
    the fake engine (tuner.testing.fake_engine.FakeScript), EngineSpec fields to the spec."""
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in EngineSpec.model_fields}
    script = {"ttft_ms": 5.0, "tpot_ms": 1.0, "startup_s": 0.0, **kwargs}
    defaults = dict(model="fake-model", served_model_name="fake",
                    vllm_cmd=(sys.executable, "-m", "tuner.testing.fake_engine"),
                    # Flags the fake must ignore, as our CPU defaults pass them to vLLM.
                    extra_args=("--enforce-eager", "--max-model-len", "4096"),
                    ready_timeout_s=15.0, request_timeout_s=10.0, level_timeout_s=60.0)
    env = {SCRIPT_ENV: json.dumps(script), "PYTHONPATH": _PYTHONPATH}
    return EngineSpec(**{**defaults, **fields, "env": {**env, **fields.get("env", {})}})


@pytest.fixture(scope="session")
def fake_spec() -> FakeSpec:
    """The factory fake_engine_spec, as a fixture."""
    return fake_engine_spec


@pytest.fixture
def fake_engine(fake_spec: FakeSpec, tmp_path: Path) -> Callable[..., Engine]:
    """`with fake_engine(ttft_ms=20) as eng:` a running fake engine, reaped afterwards."""

    def start(config: TrialConfig | None = None, **kwargs: object) -> Engine:
        return Engine(fake_spec(**kwargs), config or TrialConfig(), log_path=tmp_path / "engine.log")

    return start


def prompts(n: int, *, output_len: int = 8) -> list[Prompt]:
    """n small prompts; their text is irrelevant to the fake engine."""
    return [Prompt(prompt=f"prompt {i} a b c", prompt_len=5, output_len=output_len)
            for i in range(n)]


@pytest.fixture(scope="session")
def make_prompts() -> Callable[..., list[Prompt]]:
    return prompts


def scrape_fake(url: str) -> dict[str, float]:
    """The fake engine's own `fake:*` gauges from /metrics."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return {name: float(value) for line in text.splitlines() if line.startswith("fake:")
            for name, value in [line.split()]}


@pytest.fixture(scope="session")
def fake_stats() -> Callable[[str], dict[str, float]]:
    return scrape_fake
