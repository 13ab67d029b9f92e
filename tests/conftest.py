"""Shared fixtures: an EngineSpec for the fake engine with a given script, and a running one.

The fake engine (tuner/testing/fake_engine.py) is launched through the real Engine class, so every test
that uses it also exercises process-group start-up, /health polling and teardown.
"""

from __future__ import annotations

import importlib.util
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.measure import loadgen_clock
from tuner.measure.engine import Engine
from tuner.records.configs import EngineSpec, Prompt, TrialConfig
from tuner.testing import fake_script as _fake
from tuner.testing.fake_clock import VirtualClock

# What a child process needs to import this checkout (tests that start Python themselves).
_PYTHONPATH = _fake.PYTHONPATH
# `fake_engine_spec(ttft_ms=5, stall_requests=True, ready_timeout_s=2)`: script keys go to the
# fake engine (tuner.testing.fake_engine.FakeScript), EngineSpec fields to the spec.
fake_engine_spec = _fake.engine_spec

FakeSpec = Callable[..., EngineSpec]

# Tests marked `vllm` run vLLM's own code (the replay steps its proposers), which a dev install
# has (the `cpu` or `gpu` extra): without it they fail, so a suite missing them cannot pass
# unnoticed, unless this is set to 1 on purpose.
WITHOUT_VLLM = "TUNER_TESTS_WITHOUT_VLLM"
NO_VLLM = (f"vLLM is not installed, and this test runs vLLM's own code. Install the engine build: "
           f"scripts/setup.sh (or pip install -e '.[cpu,dev]'; '.[gpu,dev]' on a GPU host), or "
           f"set {WITHOUT_VLLM}=1 to skip the tests that need it.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"vllm: runs vLLM's own code; fails where vLLM is not installed, unless "
                   f"{WITHOUT_VLLM}=1 (then skipped)")


# --- summaries printed after the run, whatever order the tests ran in ------------------------
_SUMMARIES = pytest.StashKey[dict[str, Callable[[], str]]]()


def terminal_summary(config: pytest.Config, title: str, render: Callable[[], str]) -> None:
    """Print `render()` under `title` at the end of the session (pytest_terminal_summary):
    a table a file builds up as its tests run, printed once all have run, in any order."""
    config.stash.setdefault(_SUMMARIES, {})[title] = render


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    for title, render in config.stash.get(_SUMMARIES, {}).items():
        text = render()
        if text:
            terminalreporter.write_sep("-", title)
            terminalreporter.write_line(text)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("vllm") is None or importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get(WITHOUT_VLLM) == "1":
        pytest.skip(f"vLLM is not installed ({WITHOUT_VLLM}=1)")
    pytest.fail(NO_VLLM, pytrace=False)


def ctrl_c_delivered() -> None:
    """`preexec_fn` for a driver a test sends Ctrl-C: a test run started in the background
    (`cmd &`, nohup) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
    handler in the child, so the Ctrl-C under test would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _noise_profile_of_its_own(tmp_path_factory, monkeypatch):
    """Each test's studies keep their host noise profile (tuner.search.noise_profile) in a
    folder of that test's, never in the user's cache nor another test's: each starts from
    none, so no result depends on which tests ran before it."""
    monkeypatch.setenv("SPEC_TUNER_NOISE_DIR", str(tmp_path_factory.mktemp("noise-profile")))


@pytest.fixture(autouse=True)
def _ctrl_c_raises_keyboard_interrupt():
    """The same for tests that Ctrl-C their own process: SIGINT raises KeyboardInterrupt
    during every test, as in a foreground run, whatever the runner inherited."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def virtual_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """A virtual clock (tuner.testing.fake_clock) the load generator reads for this test; a
    fake engine started with `virtual_clock=clock.path` serves on it. TTFTs, wall times and
    throughputs then come out exactly as the script says, however loaded the host is."""
    clock = VirtualClock.create(tmp_path / "virtual-clock")
    monkeypatch.setattr(loadgen_clock, "clock", clock)
    return clock


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

