"""The engine contract as a test suite that every engine implementation runs, as Optuna's
StorageTestCase is for its storages: subclass EngineConformance in a test module (named Test...)
and set `factory` to an EngineFactory for the implementation.

The contract, through tuner.measure.engine.Engine: /health answers once start() returns; the
API refuses requests without the key and streams a completion with it; teardown leaves no
process of the group and frees the port; a crash before /health is an EngineCrashed carrying
vLLM's reason, a hang an EngineStartTimeout, and death mid-measurement an EngineDied from
tuner.measure.trial.measure; vLLM's spec-decode counters appear with a speculative config only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from tuner.errors import EngineCrashed, EngineDied, EngineStartTimeout
from tuner.measure import load_level, loadgen, metrics
from tuner.measure import trial as runner
from tuner.measure.engine import Engine
from tuner.records.configs import (
    EngineSpec,
    MeasureSettings,
    Prompt,
    TrialConfig,
    Workload,
    WorkloadSpec,
)
from tuner.testing import leaks

NGRAM = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_min": 2, "prompt_lookup_max": 4})
# A config vLLM's SpeculativeConfig refuses, and the words of its refusal.
REJECTED = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                           "prompt_lookup_min": 5, "prompt_lookup_max": 3})
REJECTED_REASON = "prompt_lookup_min=5 must be <= prompt_lookup_max=3"


class EngineFactory(Protocol):
    """How a conformance suite gets engines of one implementation."""

    def spec(self, **fields: Any) -> EngineSpec:
        """A healthy engine; `fields` override EngineSpec fields."""

    def crashing(self) -> tuple[EngineSpec, TrialConfig, str]:
        """An engine that exits before /health answers, its config, and the reason its
        message must carry."""

    def hanging(self) -> EngineSpec:
        """An engine that does not answer /health within its ready timeout of 1 s."""


def get(url: str, *, key: str | None = None, data: dict | None = None) -> tuple[int, str]:
    """Status and body of a GET (a POST with `data`), HTTP errors included."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, headers=headers,
                                 data=json.dumps(data).encode() if data is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class EngineConformance:
    """The contract's items as test methods, run against `factory`'s engines. The cheap items
    share one launch (`running`); the last of them is its teardown."""

    factory: EngineFactory

    @pytest.fixture(scope="class")
    @classmethod
    def running(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
        spec = cls.factory.spec()
        log = tmp_path_factory.mktemp("engine") / "engine.log"
        with Engine(spec, TrialConfig(), log_path=log) as eng:
            yield eng

    def test_health_answers_once_started(self, running: Engine) -> None:
        assert running.alive()
        assert running.info is not None and running.info.start_s >= 0
        assert running.url == f"http://127.0.0.1:{running.port}"
        assert get(running.url + "/health")[0] == 200

    def test_refuses_requests_without_the_api_key(self, running: Engine) -> None:
        body = {"model": running.spec.served_model_name, "prompt": "Hello", "max_tokens": 2}
        status, text = get(running.url + "/v1/completions", data=body)
        assert status == 401 and "Unauthorized" in text
        assert get(running.url + "/v1/completions", data=body, key="not-the-key")[0] == 401
        assert get(running.url + "/v1/models")[0] == 401
        assert get(running.url + "/v1/models", key=running.api_key)[0] == 200

    def test_streams_a_completion_with_the_key(self, running: Engine) -> None:
        settings = load_level.RequestSettings(model=running.spec.served_model_name,
                                           api_key=running.api_key, ignore_eos=True,
                                           request_timeout_s=120.0)
        records, _ = loadgen.run_requests(
            running.url, [Prompt(prompt="Hello, my name is", prompt_len=5, output_len=4)],
            settings, concurrency=1)
        assert records[0].ok, records[0].error
        assert records[0].output_tokens == 4 and records[0].ttft_s > 0

    def test_teardown_reaps_the_group_and_frees_the_port(self, running: Engine) -> None:
        # The last item on the shared engine: it is the teardown.
        pgid, port = os.getpgid(running.proc.pid), running.port
        running.stop()
        assert leaks.group_members(pgid) == [], "a process of the engine's group survived"
        # Not even a zombie: vLLM's children outlive their parent by a moment as orphans, and
        # stop() waits until init has reaped them (here up to about 2 s).
        assert_group_gone(pgid)
        assert_port_free(port)
        running.stop()  # idempotent
        assert not running.alive()

    def test_crash_before_health_is_engine_crashed_with_the_reason(self, tmp_path: Path) -> None:
        spec, config, reason = self.factory.crashing()
        eng = Engine(spec, config, log_path=tmp_path / "engine.log")
        with pytest.raises(EngineCrashed) as info:
            with eng:
                pytest.fail("start() returned although the engine crashed")
        message = str(info.value)
        assert re.match(r"vLLM exited with status \d+ after \d+ s, before /health answered: ",
                        message), message
        assert reason in message and reason in info.value.log_tail
        assert info.value.kind == "engine_crashed"
        assert eng.proc is None

    def test_rejected_speculative_config_carries_vllms_message(self, tmp_path: Path) -> None:
        with pytest.raises(EngineCrashed, match=REJECTED_REASON):
            with Engine(self.factory.spec(), REJECTED, log_path=tmp_path / "engine.log"):
                pass

    def test_hang_before_health_is_start_timeout(self, tmp_path: Path) -> None:
        eng = _GroupNotingEngine(self.factory.hanging(), TrialConfig(),
                                 log_path=tmp_path / "engine.log")
        t0 = time.monotonic()
        with pytest.raises(EngineStartTimeout, match=r"did not answer /health within 1 s") as info:
            with eng:
                pass
        assert time.monotonic() - t0 < 5.0
        assert info.value.kind == "engine_start_timeout"
        assert eng.proc is None
        # The hung engine and its children; none where the limit passed before an engine
        # process existed (the fast start's launcher still importing vLLM).
        for pgid in eng.pgids:
            assert leaks.group_members(pgid) == []
            assert_group_gone(pgid)

    def test_engine_killed_mid_measurement_is_engine_died(self, tmp_path: Path) -> None:
        spec = self.factory.spec()
        prompts = tuple(Prompt(prompt=f"p{i} a b", prompt_len=3, output_len=20) for i in range(4))
        workload = Workload(spec=WorkloadSpec(name="random", num_prompts=4), prompts=prompts)
        # No warm-up, so the first request in flight belongs to the level; 400 requests take
        # far longer than the kill.
        settings = MeasureSettings(concurrencies=(2,), num_requests=400, num_warmups=0)
        killed: list[int] = []
        killer = threading.Thread(
            target=sigkill_when_serving,
            args=(tmp_path / "engine.log", killed, spec.ready_timeout_s + 60.0), daemon=True)
        killer.start()
        with pytest.raises(EngineDied, match=r"vLLM exited during the c=2 level") as info:
            runner.measure(spec, TrialConfig(), workload, settings, trial_dir=tmp_path)
        killer.join(timeout=5)
        assert killed, "the engine was never killed: the test did not exercise anything"
        assert info.value.kind == "engine_died"
        assert info.value.log_tail
        # Its children lost their parent to SIGKILL; teardown killed them and waited for
        # init to reap them.
        assert leaks.group_members(killed[0]) == []
        assert_group_gone(killed[0])

    def test_spec_decode_counters_appear_with_speculation_only(self, tmp_path: Path) -> None:
        for config in (TrialConfig(), NGRAM):
            d = counted(self.factory.spec(), config, tmp_path / f"{config.method}.log")
            if config is not NGRAM:
                assert d.num_drafts == 0 and d.accepted_per_pos == ()
                continue
            assert len(d.accepted_per_pos) == NGRAM.k  # one counter per draft position
            assert 0 <= d.num_accepted_tokens <= d.num_draft_tokens <= NGRAM.k * d.num_drafts


class _GroupNotingEngine(Engine):
    """An Engine that remembers the process groups it tears down (the leader's pid)."""

    pgids: list[int]

    def stop(self) -> None:
        self.pgids = getattr(self, "pgids", [])
        if self.proc is not None:
            self.pgids.append(self.proc.pid)
        super().stop()


def counted(spec: EngineSpec, config: TrialConfig, log_path: Path):
    """vLLM's spec-decode counters over two requests of "a b c a b c" at concurrency 2."""
    prompt = [Prompt(prompt="a b c a b c", prompt_len=6, output_len=10)]
    with Engine(spec, config, log_path=log_path) as eng:
        settings = load_level.RequestSettings(model=eng.spec.served_model_name, api_key=eng.api_key,
                                           request_timeout_s=120.0)
        before = metrics.scrape(eng.url, eng.api_key)
        loadgen.run_requests(eng.url, prompt * 2, settings, concurrency=2)
        return metrics.delta(before, metrics.scrape(eng.url, eng.api_key))


def assert_group_gone(pgid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
        pytest.fail(f"process group {pgid} still has a process (live or zombie) after "
                    f"teardown: {leaks.group_members(pgid) or 'zombies only'}")


def assert_port_free(port: int) -> None:
    # SO_REUSEADDR, as every server sets it: TIME_WAIT of closed connections is not a holder.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def requests_running(url: str) -> float:
    """vLLM's gauge vllm:num_requests_running from /metrics (open without the key), summed
    over engines; 0 while the server does not answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def sigkill_when_serving(log_path: Path, killed: list[int], timeout_s: float) -> None:
    """SIGKILL the engine from outside once it serves requests (its pid and port from its
    log); the process group it led goes into `killed`."""
    deadline = time.monotonic() + timeout_s
    found = None
    while time.monotonic() < deadline and found is None:
        found = leaks.engine_of(log_path)
        time.sleep(0.02)
    while found and time.monotonic() < deadline:
        pid, port = found
        if requests_running(f"http://127.0.0.1:{port}") > 0:
            killed.append(os.getpgid(pid))
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.02)
