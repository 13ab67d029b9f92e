"""Sampling parameters end to end: --top-p, --top-k and --min-p parsed and checked, sent by
the load generator, part of the study's identity and repeated by the verify command; at
temperature 0 with them off, every stored record is as before they existed."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_fakes import fake_settings

from tuner import cli, engine_cmdline
from tuner.analysis.level_context import LevelContext
from tuner.api import engines
from tuner.errors import ConfigError
from tuner.measure import completion_request, load_level, workloads
from tuner.records.configs import EngineSpec, TrialConfig, WorkloadSpec
from tuner.records.recommendations import Basis, Verdict
from tuner.replay import sampling
from tuner.search import samplers, storage
from tuner.search import study as st

TOK = str(workloads.EMBEDDED_TOKENIZER)


class Reached(Exception):
    """Every check passed and the first stage was called."""


@pytest.fixture
def no_stage(monkeypatch):
    def record(*args, **kwargs):
        raise Reached(args, kwargs)

    monkeypatch.setattr(workloads, "load", record)


def _main(capsys, *argv: str) -> tuple[int | None, str, Reached | None]:
    try:
        return cli.main(list(argv)), capsys.readouterr().err, None
    except Reached as e:
        return None, capsys.readouterr().err, e


def test_the_flags_reach_the_workload_and_its_verify_command(no_stage, capsys, tmp_path):
    rc, err, reached = _main(capsys, "bench", "--model", TOK, "--temperature", "0.8",
                             "--top-p", "0.9", "--top-k", "50", "--output-dir", str(tmp_path))
    assert rc is None and reached is not None, err
    spec = reached.args[0][0]
    assert (spec.temperature, spec.top_p, spec.top_k, spec.min_p) == (0.8, 0.9, 50, 0.0)
    line = engine_cmdline.verify_command(engine=EngineSpec(model="m"), workload=spec,
                                         config=TrialConfig(), concurrency=1)
    assert "--temperature 0.8 --top-p 0.9 --top-k 50 " in line and "--min-p" not in line


@pytest.mark.parametrize(("argv", "says"), [
    (["--top-p", "0"], "--top-p 0: must be a finite number between 0.001 and 1"),
    (["--top-k", "-1"], "--top-k -1: must be a whole number of tokens between 0 and"),
    (["--min-p", "1.5"], "--min-p 1.5: must be a finite number between 0 and 1"),
    (["--top-p", "0.9", "--top-k", "5"],
     "--top-p 0.9, --top-k 5 at --temperature 0: vLLM samples greedily there and ignores them"),
    (["--temperature", "0.8", "--min-p", "0.1", "--speculative-config",
      '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}'],
     "--min-p 0.1: vLLM refuses min_p with speculative decoding"),
])
def test_bad_sampling_is_one_line_and_status_2(no_stage, capsys, tmp_path, argv, says):
    rc, err, _ = _main(capsys, "bench", "--model", TOK, *argv, "--output-dir", str(tmp_path))
    assert rc == 2 and len(err.splitlines()) == 1 and says in err, err


def test_a_study_refuses_min_p_but_a_plain_bench_takes_it(no_stage, capsys, tmp_path):
    rc, err, _ = _main(capsys, "optimize", "--model", TOK, "--temperature", "0.8", "--min-p",
                       "0.1", "--output-dir", str(tmp_path / "s"))
    assert rc == 2 and "vLLM refuses min_p with speculative decoding" in err
    rc, err, reached = _main(capsys, "bench", "--model", TOK, "--temperature", "0.8",
                             "--min-p", "0.1", "--output-dir", str(tmp_path / "b"))
    assert reached is not None and reached.args[0][0].min_p == 0.1, err


def test_off_values_are_left_out_of_every_dump():
    plain = WorkloadSpec(name="sharegpt")
    assert set(plain.model_dump()) == set(plain.model_dump(mode="json")) == {
        "name", "dataset_path", "num_prompts", "seed", "output_len", "max_input_tokens",
        "skip_chat_template", "category", "random_input_len", "random_output_len",
        "temperature", "ignore_eos"}  # as stored before --top-p, --top-k and --min-p
    assert plain.sampling == {"temperature": 0.0}
    sampled = WorkloadSpec(name="sharegpt", temperature=0.7, top_k=40)
    assert sampled.model_dump()["top_k"] == 40 and "top_p" not in sampled.model_dump()
    assert WorkloadSpec.model_validate(sampled.model_dump()) == sampled
    assert sampled.sampling == WorkloadSpec.sampling_of(sampled.model_dump()) == {
        "temperature": 0.7, "top_k": 40}


def test_the_request_sends_them_when_sampling_and_never_at_temperature_0():
    greedy = load_level.RequestSettings(model="m", api_key="k")
    assert completion_request.sampling(greedy) == {}
    # when sampling, all three: the server would fill in the model's generation config
    hot = load_level.RequestSettings(model="m", api_key="k", temperature=0.8, top_k=50)
    assert completion_request.sampling(hot) == {"top_p": 1.0, "top_k": 50, "min_p": 0.0}


def _create(out: Path, workload: dict) -> None:
    settings = fake_settings().model_copy(update={
        "objectives": ("output_throughput",), "workload_digest": "d", "target_concurrency": 1,
        "workload": WorkloadSpec.model_validate(workload)})
    with storage.driver(say=lambda _m: None):
        st.create(out_dir=out, name="s", objectives=list(settings.objectives),
                  sampler=samplers.make_sampler("random", seed=0, constrained=False),
                  storage_url=None, settings=settings)


def test_a_study_at_other_sampling_is_another_study(tmp_path):
    old = {"name": "sharegpt", "temperature": 0.0}  # stored before the new parameters
    _create(tmp_path, old)
    _create(tmp_path, WorkloadSpec(name="sharegpt").model_dump())  # resumes
    with pytest.raises(ConfigError, match="was started with sampling=.*'temperature': 0.0"):
        _create(tmp_path, WorkloadSpec(name="sharegpt", temperature=0.8).model_dump())


def test_a_mismatch_recorded_for_a_level_ends_its_recommendations_reason():
    line = "vLLM 0.32.0 (cpu) accepted 1.00 tokens per draft step ..."
    settings = fake_settings().model_copy(update={"sampling_mismatch": {"4": line}})
    too_few = Verdict(basis=Basis.TOO_FEW_CONFIGS, configs_completed=1)
    at = LevelContext(concurrency=4, slos={}, settings=settings)
    assert at.answer("insufficient_data", too_few).verdict.sampling_mismatch == line
    other = LevelContext(concurrency=1, slos={}, settings=settings)
    assert other.answer("insufficient_data", too_few).verdict.sampling_mismatch is None


def test_the_cpu_build_is_warned_about_once_up_front_when_sampling():
    said: list[str] = []
    cpu = EngineSpec(model="m", device="cpu")
    engines.warn_sampling(cpu, WorkloadSpec(name="sharegpt", temperature=0.8), said.append)
    engines.warn_sampling(cpu, WorkloadSpec(name="sharegpt"), said.append)
    engines.warn_sampling(cpu.model_copy(update={"device": "cuda"}),
                          WorkloadSpec(name="sharegpt", temperature=0.8), said.append)
    assert said == [sampling.known_defect(device="cpu", temperature=0.8)]
    assert "vLLM #55005" in said[0] and said[0].count("\n") == 0


def test_the_cpu_defect_warning_names_the_releases_known_to_carry_it():
    assert sampling.known_defect(device="cpu", temperature=0.8, version="0.32.0")
    assert sampling.known_defect(device="cpu", temperature=0.8, version="0.31.2")
    assert sampling.known_defect(device="cpu", temperature=0.8, version=None)  # unknown: warn
    assert sampling.known_defect(device="cpu", temperature=0.8, version="0.33.0") is None
    assert sampling.known_defect(device="cpu", temperature=0.0, version="0.32.0") is None
    assert sampling.known_defect(device="cuda", temperature=0.8, version="0.32.0") is None
