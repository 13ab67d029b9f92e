"""tuner.engine_cmdline: the engine flags the tuner reads mean what they mean to vLLM, in every form
vLLM accepts; argv, serve and verify commands come from one place."""

from __future__ import annotations

import importlib.util
import json
import shlex

import pytest

from tuner import engine_cmdline
from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec, TrialConfig, WorkloadSpec

INSTRUCTCODER = WorkloadSpec(name="instructcoder")

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
TP_FORMS = [
    (("--tensor-parallel-size", "2"), 2), (("--tensor-parallel-size=2",), 2),
    (("-tp", "2"), 2), (("-tp=2",), 2), (("--tensor_parallel_size", "2"), 2),
    (("-tp", "4", "-tp", "2"), 2), (("--enforce-eager",), None),
]


@pytest.mark.parametrize("args, want", TP_FORMS)
def test_the_fallback_reads_tensor_parallel_in_every_form(args, want):
    assert engine_cmdline.read_engine_args(args).get("tensor_parallel_size") == want


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here")
@pytest.mark.parametrize("args, want", TP_FORMS)
def test_vllms_own_parser_agrees_with_the_fallback(args, want):
    assert engine_cmdline.read_engine_args(args, with_vllm=True).get("tensor_parallel_size") == want


@pytest.mark.parametrize("args, gpus", [
    (("--tensor-parallel-size=2",), 2), (("-tp", "2"), 2), (("-tp=2",), 2),
    (("-tp", "2", "--pipeline-parallel-size", "2"), 4), ((), 1),
])
def test_an_engine_reserves_one_gpu_per_rank(args, gpus):
    # The bug this replaces scanned for "--tensor-parallel-size" followed by a separate value
    # and reserved one GPU for `--tensor-parallel-size=2` or `-tp=2`.
    spec = EngineSpec(model="m", vllm_cmd=("serve",), extra_args=args)
    assert engine_cmdline.gpus_per_engine(spec) == gpus


@pytest.mark.parametrize("text, want", [("4096", 4096), ("4k", 4000), ("4K", 4096),
                                        ("auto", None), ("-1", None), ("", None)])
def test_human_readable_integers_read_as_vllm_reads_them(text, want):
    assert engine_cmdline.human_int(text) == want


def test_the_engine_argv_carries_the_config_and_the_users_flags_last():
    spec = EngineSpec(model="/m", extra_args=("--max-num-seqs", "8"))
    config = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3},
                         engine_args={"enforce_eager": True, "block_size": 32})
    argv = engine_cmdline.engine_argv(spec, config, port=8123, api_key="k")
    assert argv[argv.index("--speculative-config") + 1] == config.spec_json()
    assert argv[-5:] == ["--block-size", "32", "--enforce-eager", "--max-num-seqs", "8"]
    assert argv[argv.index("--port") + 1] == "8123"


def test_the_serve_command_is_what_was_measured_and_pastes_into_a_shell():
    spec = EngineSpec(model="/models/a b", extra_args=("--enforce-eager",))
    config = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 5})
    parts = shlex.split(engine_cmdline.serve_command(spec, config))
    assert parts[:3] == ["vllm", "serve", "/models/a b"]
    assert json.loads(parts[parts.index("--speculative-config") + 1])["method"] == "ngram"
    assert parts[-1] == "--enforce-eager"


def test_the_embedded_defaults_serve_command_names_its_hub_id_with_a_note():
    embedded = EngineSpec(model="/cache/smollm2-bf16", model_name=engine_cmdline.EMBEDDED_HUB_ID)
    assert engine_cmdline.serve_command(embedded, TrialConfig()) == \
        f"vllm serve {engine_cmdline.EMBEDDED_HUB_ID}"
    assert engine_cmdline.serve_note(embedded) == engine_cmdline.EMBEDDED_SERVE_NOTE
    # The hub checkpoint itself (--model HuggingFaceTB/...), a path, an old study: no note.
    for engine in (EngineSpec(model=engine_cmdline.EMBEDDED_HUB_ID,
                              model_name=engine_cmdline.EMBEDDED_HUB_ID),
                   EngineSpec(model="/models/x", model_name="./x"),
                   EngineSpec(model="/cache/smollm2"), None):
        assert engine_cmdline.serve_note(engine) is None


def test_bad_quoting_is_a_user_mistake():
    with pytest.raises(ConfigError, match="check the quotes"):
        engine_cmdline.split("--model 'unterminated", flag="--engine-args")


def test_the_verify_command_parses_back_to_the_same_engine_flags():
    # Its engine strings start with "--": the line must read back through tuner's own CLI.
    from tuner import cli

    config = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3},
                         engine_args={"no_async_scheduling": True})
    line = engine_cmdline.verify_command(
        engine=EngineSpec(model="/m", vllm_cmd=("/opt/v/bin/python", "-m", "vllm"),
                          extra_args=("--max-num-seqs", "8")),
        workload=WorkloadSpec(name="instructcoder", num_prompts=16), config=config,
        concurrency=4)
    argv = shlex.split(line)
    assert argv[:2] == ["tuner", "bench"]
    parser = cli.build_parser()
    args = parser.parse_args(cli.attach_engine_strings(argv[1:], cli.option_strings(parser)))
    # argparse's converters (tuner.checks) hand them over parsed.
    assert args.engine_args == ("--max-num-seqs", "8", "--no-async-scheduling")
    assert args.vllm_cmd == ("/opt/v/bin/python", "-m", "vllm")
    assert args.speculative_config == config.speculative_config
    # And in the form a person types, the value as its own (quoted) word:
    spaced = [part for a in argv[1:] for part in (a.split("=", 1) if a.startswith(
        ("--engine-args=", "--vllm-cmd=")) else [a])]
    again = parser.parse_args(cli.attach_engine_strings(spaced, cli.option_strings(parser)))
    assert (again.engine_args, again.vllm_cmd) == (args.engine_args, args.vllm_cmd)


@pytest.mark.parametrize("engine, model", [
    # The embedded default: named by its hub id, loaded from the cache; `tuner bench` loads
    # it without --model (the H200 study printed the cache path here).
    ({"model": "/root/.cache/spec-tuner/models/smollm2-135m-instruct-bf16",
      "model_name": engine_cmdline.EMBEDDED_HUB_ID}, None),
    # The same hub id typed by the user is what they gave.
    ({"model": engine_cmdline.EMBEDDED_HUB_ID, "model_name": engine_cmdline.EMBEDDED_HUB_ID},
     engine_cmdline.EMBEDDED_HUB_ID),
    ({"model": "/home/u/models/llama", "model_name": "./models/llama"}, "./models/llama"),
    ({"model": "meta-llama/Llama-3.1-8B", "model_name": "meta-llama/Llama-3.1-8B"},
     "meta-llama/Llama-3.1-8B"),
    ({"model": "/models/old"}, "/models/old"),  # stored before names were kept
])
def test_the_verify_command_names_the_model_as_the_user_gave_it(engine, model):
    from tuner import cli

    line = engine_cmdline.verify_command(engine=EngineSpec(**engine), workload=INSTRUCTCODER,
                                         config=TrialConfig(), concurrency=1)
    assert "/root/.cache" not in line
    args = cli.build_parser().parse_args(shlex.split(line)[1:])
    assert args.model == model


def test_the_verify_command_keeps_the_studys_tokenizer():
    # A README review: the recommendation's verify line dropped --tokenizer, so a re-measure
    # of a model without its own tokenizer files failed.
    from tuner import cli

    line = engine_cmdline.verify_command(
        engine=EngineSpec(model="fake-model", tokenizer="/tok/dir x"), workload=INSTRUCTCODER,
        config=TrialConfig(), concurrency=1)
    assert cli.build_parser().parse_args(shlex.split(line)[1:]).tokenizer == "/tok/dir x"
    plain = engine_cmdline.verify_command(engine=EngineSpec(model="m"), workload=INSTRUCTCODER,
                                          config=TrialConfig(), concurrency=1)
    assert "--tokenizer" not in plain


def test_one_reading_of_an_engine_command_line_serves_every_reader():
    # parse_flags is the only reading without vLLM: the serve config, the aligned baseline,
    # the engine path's flags and the engine limits all go through it.
    from tuner.engine_cmdline import Flag, parse_flags

    argv = ["-tp", "2", "--max_num_seqs=8", "--seed", "-1", "--enforce-eager",
            "--no-async-scheduling", "stray", "--compilation-config", '{"level": 0}']
    assert parse_flags(argv) == [
        Flag("tensor-parallel-size", "2"), Flag("max-num-seqs", "8"), Flag("seed", "-1"),
        Flag("enforce-eager", None), Flag("no-async-scheduling", "stray"),
        Flag("compilation-config", '{"level": 0}')]
    # The readers agree on it: the limits take the last of a flag given twice.
    assert engine_cmdline.read_engine_args_fallback(
        ["-tp=4", "--max-model-len", "4k", "--max-model-len=2K"]) == {
        "tensor_parallel_size": 4, "max_model_len": 2048}
    from tuner import checks

    aligned = checks.aligned_baseline("-tp 2 --no-async-scheduling", ())
    assert aligned.engine_args == {"tensor_parallel_size": "2", "no_async_scheduling": True}
