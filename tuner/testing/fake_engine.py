"""A fake vLLM OpenAI-compatible server whose timing and faults follow a script.

Used by the tests, for fault injection and by the fidelity benchmark; it never generates real
text. It accepts the command line our engine stage passes to vLLM (unknown flags are ignored),
serves GET /health, GET /metrics (vLLM's spec-decode counters when a speculative config is given,
plus `fake:*` gauges), GET /v1/models and POST /v1/completions streamed exactly as vLLM streams
it, token ids included when asked (`return_token_ids`; a word of the prompt is a token, and
output token i is prompt word i, cyclically, so ids depend on the prompt alone). Token i of a
request is written at arrival + ttft + i * tpot against absolute deadlines
(arrival: when the request's first bytes reached the process), so the scripted TTFT and TPOT
are what a client should measure at any concurrency; GET /fake/served tells, per request, when
the server really wrote, which is the truth benchmarks/fidelity.py compares with.
On a virtual clock (script key `virtual_clock`, tuner.testing.fake_clock) the same
deadlines are virtual and exact, and the load model counts the batch of a step from the
requests' virtual times, so a run is the same however loaded the host is.
Run it as `python -m tuner.testing.fake_engine --port 8000 --fake-script '{"ttft_ms": 80}'`.

This module is the process: its command line, vLLM's start-up lines and failures. The script
is tuner.testing.fake_script's, the completions tuner.testing.fake_completion's, the timing
tuner.testing.fake_pace's and the HTTP routes tuner.testing.fake_server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

from pydantic import ValidationError

from tuner.records.configs import TrialConfig
from tuner.speculative.proposer_settings import ProposerSettings
from tuner.testing import fake_pace
from tuner.testing.fake_pace import ServerState
from tuner.testing.fake_script import SCRIPT_ENV, FakeScript, load_script
from tuner.testing.fake_server import FAKE_VERSION, exit_reaping, log, serve

# K where vLLM would take it from the draft model's config (EAGLE, MTP: TrialConfig.k is None),
# which the fake has none of.
FAKE_K_WHERE_VLLM_READS_THE_DRAFT_MODEL = 1


def _log_path(script: FakeScript, *, spec_method: str | None, no_async: bool) -> None:
    log(f"non-default args: {({'async_scheduling': False} if no_async else {})!r}")
    if spec_method and script.speculative_path_differs:
        log(f"Async scheduling not supported with {spec_method}-based speculative decoding "
            "and will be disabled.", "WARNING")
        log(f"Model Runner V2 does not yet support {spec_method}; using the V1 model runner "
            "instead.", "WARNING")
    elif os.environ.get("VLLM_USE_V2_MODEL_RUNNER") != "0":
        log("Using V2 Model Runner")
    if script.cudagraph_mode:
        log(f"Initializing a V1 LLM engine (v{FAKE_VERSION}) with config: device_config=cuda, "
            f"compilation_config={{'cudagraph_mode': <CUDAGraphMode.{script.cudagraph_mode}: "
            "(2, 1)>}")


def _spec_tokens(settings: ProposerSettings | None) -> int:
    """k of the speculative config; exits as vLLM does when it rejects an ngram window."""
    if settings is None:
        return 0
    if settings.method in ("ngram", "[ngram]"):
        lo, hi = settings.window
        if lo > hi:
            # The exact shape of vLLM's output: pydantic wraps the ValueError of the config.
            print("Traceback (most recent call last):\n"
                  '  File "vllm/engine/arg_utils.py", line 1, in create_speculative_config\n'
                  "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                  f"SpeculativeConfig\n  Value error, prompt_lookup_min={lo} must be <= "
                  f"prompt_lookup_max={hi} [type=value_error, input_value=ArgsKwargs((), "
                  "{...}), input_type=ArgsKwargs]\n    For further information visit "
                  "https://errors.pydantic.dev/2.14/v/value_error", file=sys.stderr, flush=True)
            sys.exit(1)
    return FAKE_K_WHERE_VLLM_READS_THE_DRAFT_MODEL if settings.k is None else settings.k


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tuner.testing.fake_engine", description=__doc__)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--speculative-config", type=json.loads, default=None)
    p.add_argument("--fake-script", default=None,
                   help=f"JSON string or file (default: ${SCRIPT_ENV}, else built-in timing)")
    p.add_argument("--fake-loop", choices=("asyncio", "uvloop"), default="asyncio",
                   help="event loop of the server (benchmarks/fidelity.py compares them)")
    return p


def main(argv: list[str] | None = None) -> None:
    args, ignored = _parser().parse_known_args(argv)
    try:
        script = load_script(args.fake_script or os.environ.get(SCRIPT_ENV))
    except (OSError, ValidationError, ValueError) as e:
        print(f"fake_engine: bad script: {e}", file=sys.stderr)
        sys.exit(2)
    log(f"vLLM API server version {FAKE_VERSION}")
    log(f"args: model={args.model!r} ignored={ignored!r} script={script.model_dump_json()}")
    spec = args.speculative_config or {}  # the --speculative-config JSON, read once here
    settings = ProposerSettings.of(TrialConfig(speculative_config=spec))
    spec_tokens = _spec_tokens(settings)
    if settings is not None:
        log(f"SpeculativeConfig(method={settings.method!r}, num_spec_tokens={spec_tokens})")
    _log_path(script, spec_method=settings.method if settings else None,
              no_async="--no-async-scheduling" in ignored)
    crash = script.crash_on_start or (
        f"ValueError: fake rejection of {script.crash_for_spec}" if script.crash_for_spec
        and spec and all(spec.get(k) == v for k, v in script.crash_for_spec.items()) else None)
    if crash:
        log("EngineCore failed to start.", "ERROR")
        message = crash
        last = message if "Error:" in message else f"RuntimeError: {message}"
        print(f"Traceback (most recent call last):\n  File \"fake_engine.py\", line 1, in main\n"
              f"{last}", file=sys.stderr, flush=True)
        sys.exit(1)
    # Until the server runs: exit at once on SIGTERM, reaping the child as vLLM reaps its
    # EngineCore (an orphan would linger as a zombie in the group). Set before the child
    # exists, so no SIGTERM can orphan it.
    children: list[subprocess.Popen] = []
    signal.signal(signal.SIGTERM, signal.SIG_IGN if script.ignore_sigterm  # child inherits it
                  else lambda *_: exit_reaping(children[0] if children else None))
    if script.child_process:
        # Same process group, so only a group kill reaches it if we die first.
        children.append(subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(1e9)"], stdin=subprocess.DEVNULL))
    child = children[0] if children else None
    if script.hang_before_health:
        while True:
            time.sleep(3600)
    time.sleep(script.startup_s)
    state = ServerState(script=script, model=args.served_model_name or args.model,
                        api_key=args.api_key, spec_tokens=spec_tokens, child=child,
                        schedule=settings.k_schedule if settings else (),
                        accepted_per_pos=[0] * spec_tokens,
                        rng=random.Random(f"{script.drafter_seed}:{spec_tokens}"))
    if script.virtual_clock:
        _run_on_virtual_clock(script.virtual_clock, serve(state, args.host, args.port))
    elif args.fake_loop == "uvloop":
        import uvloop

        uvloop.run(serve(state, args.host, args.port))
    else:
        asyncio.run(serve(state, args.host, args.port))


def _run_on_virtual_clock(path: str, coro) -> None:
    from tuner.testing.fake_clock import VirtualClock

    clock = VirtualClock(path)
    fake_pace.use_virtual_clock(clock)
    loop = clock.new_event_loop(alone=False)
    asyncio.set_event_loop(loop)
    loop.run_until_complete(coro)


if __name__ == "__main__":
    main()
