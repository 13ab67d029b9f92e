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
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import tuner
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.speculative.proposer_settings import ProposerSettings

SCRIPT_ENV = "FAKE_ENGINE_SCRIPT"
FAKE_VERSION = "0.0.0+fake"
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions
SPIN_S = 0.0015  # the precise wait's last stretch: timer slop of asyncio plus a VM's wake-up
VOCAB_SIZE = 49152  # SmolLM2's, so fake ids look like the embedded model's
EOS_ID = 2  # the embedded SmolLM2-Instruct's <|im_end|>: an output that stopped on EOS ends with it
# K where vLLM would take it from the draft model's config (EAGLE, MTP: TrialConfig.k is None),
# which the fake has none of.
FAKE_K_WHERE_VLLM_READS_THE_DRAFT_MODEL = 1


class FakeScript(BaseModel):
    """What the fake engine does: timing, speculation counters and injected faults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_ms: float = Field(50.0, ge=0)
    tpot_ms: float = Field(10.0, ge=0)
    # Tokens per streamed chunk after the first (the first chunk is the prefill's one token),
    # as speculative decoding emits 1 + accepted tokens per step.
    tokens_per_chunk: int = Field(1, ge=1)
    output_tokens: int | None = Field(None, ge=1)  # None: max_tokens; else EOS after this many
    startup_s: float = Field(0.2, ge=0)
    # Every draft position is accepted at this rate: acceptance rate = accept_rate exactly,
    # acceptance length = 1 + k * accept_rate, per-position rates all accept_rate.
    accept_rate: float = Field(0.6, ge=0, le=1)
    crash_on_start: str | None = None  # printed like vLLM's last traceback line, then exit 1
    # Crash at start only for a speculative config holding every key/value of this one
    # (a config vLLM rejects while the rest of the space runs).
    crash_for_spec: dict[str, Any] | None = None
    hang_before_health: bool = False  # alive, never listens (vLLM stuck loading the model)
    stall_requests: bool = False  # accepts completions, never answers
    malformed_every: int | None = Field(None, ge=1)  # every Nth request: a broken JSON chunk
    http_error_every: int | None = Field(None, ge=1)  # every Nth request: HTTP 500
    die_after_requests: int | None = Field(None, ge=0)  # request N+1 exits the process mid-stream
    child_process: bool = False  # a second process in the group, as vLLM's EngineCore
    ignore_sigterm: bool = False  # it and its child ignore SIGTERM: only SIGKILL stops them
    # A load model for policy tests (both 0 = TPOT is exactly tpot_ms, as fidelity needs):
    # every other request in flight stretches a step by load_per_seq, and each draft token of
    # each sequence in the batch adds verify_cost_per_token to it; a step yields
    # 1 + K * accept_rate tokens. So speculation pays at low load and stops paying above it.
    load_per_seq: float = Field(0.0, ge=0)
    verify_cost_per_token: float = Field(0.0, ge=0)
    # A model-based drafter (draft_model, EAGLE, MTP), simulated: drafter_rates[i] is the rate
    # at which draft position i+1 is accepted (vLLM's per-position rate, accepted at i over
    # drafts: non-increasing; positions past the list accept none). Each draft's accepted
    # count is drawn (seeded by drafter_seed and K), so the counters spread as a real
    # engine's do, and a step yields 1 + sum of the first K rates tokens on average. Where
    # set it replaces accept_rate. Under the load model the drafter's cost is added to each
    # speculative step: drafter_ms_per_step, plus drafter_ms_per_token per drafted position.
    drafter_rates: tuple[float, ...] | None = None
    drafter_seed: int = 0
    drafter_ms_per_token: float = Field(0.0, ge=0)
    drafter_ms_per_step: float = Field(0.0, ge=0)
    # The engine path, in vLLM 0.26's lines (tuner.measure.enginepath reads them): V2 runner
    # with async scheduling, unless --no-async-scheduling or VLLM_USE_V2_MODEL_RUNNER=0 say
    # otherwise; with this set, a speculative config falls back to V1 without async
    # scheduling, as n-gram does on the GPU build (False: the CPU build, one path for all).
    speculative_path_differs: bool = False
    # vLLM's CUDAGraphMode name for the engine's config line (None: no line, as before); with
    # FULL_AND_PIECEWISE, tuner.replay.cost prices non-uniform steps as the GPU build needs.
    cudagraph_mode: str | None = None
    # A tuner.testing.fake_clock file: serve on that virtual clock (tokens due at virtual
    # times, the load model's batch counted by them) instead of the wall clock.
    virtual_clock: str | None = None


    @field_validator("drafter_rates")
    @classmethod
    def _rates_fall(cls, rates: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if rates is not None and (any(not 0 <= r <= 1 for r in rates)
                                  or any(b > a for a, b in itertools.pairwise(rates))):
            raise ValueError(f"drafter_rates {list(rates)}: each in [0, 1], non-increasing "
                             "(position i+1 is accepted only where position i was)")
        return rates

    @property
    def load_model(self) -> bool:
        return bool(self.load_per_seq or self.verify_cost_per_token
                    or self.drafter_ms_per_token or self.drafter_ms_per_step)

    def expected_accepted(self, k: int) -> float:
        """Draft tokens a step of K = k accepts on average."""
        if self.drafter_rates is not None:
            return float(sum(self.drafter_rates[:k]))
        return k * self.accept_rate


# The fake runs as `python -m tuner.testing.fake_engine` in a child process; this package must
# be importable there whether or not it is installed.
PYTHONPATH = os.pathsep.join(filter(None, [str(Path(tuner.__file__).resolve().parent.parent),
                                           os.environ.get("PYTHONPATH")]))


def engine_spec(**kwargs: Any) -> EngineSpec:
    """`engine_spec(ttft_ms=5, stall_requests=True, ready_timeout_s=2)`: the EngineSpec that
    launches the fake through the real Engine class. Script keys (FakeScript) go to the fake,
    EngineSpec fields to the spec."""
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in EngineSpec.model_fields}
    script = {"ttft_ms": 5.0, "tpot_ms": 1.0, "startup_s": 0.0, **kwargs}
    defaults = dict(model="fake-model", served_model_name="fake",
                    vllm_cmd=(sys.executable, "-m", "tuner.testing.fake_engine"),
                    # Flags the fake must ignore, as our CPU defaults pass them to vLLM.
                    extra_args=("--enforce-eager", "--max-model-len", "4096"),
                    ready_timeout_s=15.0, request_timeout_s=10.0, level_timeout_s=60.0)
    env = {SCRIPT_ENV: json.dumps(script), "PYTHONPATH": PYTHONPATH}
    return EngineSpec(**{**defaults, **fields, "env": {**env, **fields.get("env", {})}})


def load_script(source: str | None) -> FakeScript:
    """A script from a JSON string, a path to a JSON file, or the defaults when None."""
    if not source:
        return FakeScript()
    text = source if source.lstrip().startswith("{") else Path(source).read_text()
    return FakeScript.model_validate_json(text)


def token_id(word: str) -> int:
    """The fake tokenizer: one id per whitespace-separated word, stable across processes
    (hash() is salted per process), never one of SmolLM2's special ids 0-2 (EOS_ID among them)."""
    return 3 + zlib.crc32(word.encode()) % (VOCAB_SIZE - 3)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def chunk_ends(num_tokens: int, tokens_per_chunk: int) -> list[int]:
    """Index of the last token in each chunk: [0], then steps of tokens_per_chunk to n-1."""
    ends = [0]
    while ends[-1] < num_tokens - 1:
        ends.append(min(ends[-1] + tokens_per_chunk, num_tokens - 1))
    return ends[:num_tokens]


@dataclass
class _State:
    script: FakeScript
    model: str
    api_key: str | None
    spec_tokens: int  # k of the speculative config; 0 without speculation
    # num_speculative_tokens_per_batch_size, honoured like vLLM
    schedule: tuple[tuple[int, int, int], ...] = ()
    child: subprocess.Popen | None = None
    created: float = field(default_factory=time.time)
    requests: int = 0
    inflight: int = 0
    max_inflight: int = 0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: list[int] = field(default_factory=list)  # drafter_rates' drawn counts
    rng: random.Random = field(default_factory=random.Random)
    lag_sum_s: float = 0.0
    lag_count: int = 0
    lag_max_s: float = 0.0
    # Per request since the last reset, on CLOCK_MONOTONIC: what the server really did, the
    # truth benchmarks/fidelity.py holds the client's figures against.
    served: list[_Served] = field(default_factory=list)
    # Requests in flight by number: [arrival, due time of the last chunk once it is known].
    live: dict[int, list] = field(default_factory=dict)

    def batch_at(self, t: float, number: int) -> int:
        """The batch of a step at time `t` for request `number`: it, and every request that
        arrived before `t` and has a chunk after it. Read from the requests' own times, not
        from which handler ran first, so a tie on a virtual clock always counts the same."""
        return 1 + sum(1 for n, (arrival, last) in self.live.items()
                       if n != number and arrival < t and (last is None or last > t))


@dataclass
class _Served:
    """One completed request as GET /fake/served tells it, on CLOCK_MONOTONIC: when it
    arrived, when its first chunk was written (streamed only), its tokens and its end."""

    number: int
    prompt: str  # the prompt's first 64 characters, to match the client's records by
    arrival: float
    first_write: float | None = None
    tokens: int | None = None
    eof: float | None = None


@dataclass(frozen=True)
class _Request:
    """What the fake reads of a POST /v1/completions body, read once from its JSON."""

    prompt_text: str  # the prompt as text (ids as their list's text)
    words: list[str]  # the fake tokenizer's tokens: the prompt text's words
    prompt_ids: list[int]
    max_tokens: int
    stream: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False
    include_usage: bool = False  # stream_options.include_usage

    @classmethod
    def parse(cls, body: dict[str, Any]) -> _Request:
        """Raises ValueError or TypeError for a field of the wrong type."""
        prompt = body.get("prompt", "")
        words = (prompt.split() if isinstance(prompt, str) else []) or ["token"]
        return cls(prompt_text=str(prompt), words=words,
                   prompt_ids=prompt if isinstance(prompt, list) else [token_id(w) for w in words],
                   max_tokens=int(body.get("max_tokens") or DEFAULT_MAX_TOKENS),
                   stream=bool(body.get("stream")), ignore_eos=bool(body.get("ignore_eos")),
                   return_token_ids=bool(body.get("return_token_ids")),
                   include_usage=bool((body.get("stream_options") or {}).get("include_usage")))


# The server's clock: CLOCK_MONOTONIC, or a virtual clock's (main() swaps it).
_now = time.monotonic
_VIRTUAL = False

# When the bytes of each connection's current request first reached this process. aiohttp
# starts a handler only after parsing it and scheduling a task, which under a burst of a
# hundred requests is milliseconds later: stamping here keeps the script's clock honest.
_ARRIVALS: dict[Any, float] = {}


def _stamp_arrivals() -> None:
    from aiohttp import web_protocol

    handler = web_protocol.RequestHandler
    if getattr(handler, "_fake_stamped", False):
        return
    data_received, connection_lost = handler.data_received, handler.connection_lost

    def stamped_data_received(self, data: bytes) -> None:
        if data:  # aiohttp calls it with b"" itself to re-parse what it buffered
            _ARRIVALS.setdefault(self, _now())
        data_received(self, data)

    def forgetting_connection_lost(self, exc) -> None:
        _ARRIVALS.pop(self, None)
        connection_lost(self, exc)

    handler.data_received = stamped_data_received
    handler.connection_lost = forgetting_connection_lost
    handler._fake_stamped = True


@web.middleware
async def _arrival(request: web.Request, handler):
    # One request at a time per connection (clients do not pipeline), so the stamp is this
    # request's; popping it leaves the next request on the connection to stamp its own.
    request["arrival"] = _ARRIVALS.pop(request.protocol, None) or _now()
    return await handler(request)


def _log(message: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) {level} {stamp} [fake_engine.py] {message}",
          file=sys.stderr, flush=True)


def _log_path(script: FakeScript, *, spec_method: str | None, no_async: bool) -> None:
    _log(f"non-default args: {({'async_scheduling': False} if no_async else {})!r}")
    if spec_method and script.speculative_path_differs:
        _log(f"Async scheduling not supported with {spec_method}-based speculative decoding "
             "and will be disabled.", "WARNING")
        _log(f"Model Runner V2 does not yet support {spec_method}; using the V1 model runner "
             "instead.", "WARNING")
    elif os.environ.get("VLLM_USE_V2_MODEL_RUNNER") != "0":
        _log("Using V2 Model Runner")
    if script.cudagraph_mode:
        _log(f"Initializing a V1 LLM engine (v{FAKE_VERSION}) with config: device_config=cuda, "
             f"compilation_config={{'cudagraph_mode': <CUDAGraphMode.{script.cudagraph_mode}: "
             "(2, 1)>}")


def _exit(child: subprocess.Popen | None) -> None:
    if child is not None:
        child.terminate()
        child.wait(timeout=5)
    sys.stderr.flush()
    os._exit(0)


def _k_for_batch(state: _State, batch: int) -> int:
    if not state.spec_tokens or not state.schedule:
        return state.spec_tokens
    for start, end, k in state.schedule:
        if start <= batch <= end:
            return min(int(k), state.spec_tokens)
    return min(int(state.schedule[-1][2]), state.spec_tokens)


def _effective_tpot_ms(script: FakeScript, k: int, inflight: int) -> float:
    if not script.load_model:
        return script.tpot_ms
    step = script.tpot_ms * (1 + script.load_per_seq * max(inflight - 1, 0))
    if k:
        step *= 1 + script.verify_cost_per_token * k * max(inflight, 1)
        step += script.drafter_ms_per_step + script.drafter_ms_per_token * k
        return step / (1 + script.expected_accepted(k))
    return step


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


async def _sleep_until(deadline: float, *, precise: bool) -> None:
    """Wait until the server's clock reaches `deadline`; never return early."""
    while (wait_s := deadline - _now()) > 0:
        if not precise or _VIRTUAL:  # virtual time has no timer slop to spin through
            await asyncio.sleep(wait_s)
        elif wait_s > SPIN_S:
            await asyncio.sleep(wait_s - SPIN_S)
        else:
            # asyncio rounds its epoll timeout up to whole milliseconds, so a timer fires up
            # to 1 ms late; the last stretch yields to other requests until the deadline.
            await asyncio.sleep(0)


def _unauthorized(request: web.Request, state: _State) -> bool:
    # vLLM guards only the API routes; /health and /metrics stay open.
    if state.api_key is None or not request.path.startswith("/v1"):
        return False
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() != "bearer" or token != state.api_key


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


async def _completions(request: web.Request) -> web.StreamResponse:
    t0 = request["arrival"]  # the scripted TTFT counts from here
    state: _State = request.app["state"]
    script = state.script
    if _unauthorized(request, state):
        return web.json_response({"error": "Unauthorized"}, status=401)
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "request body is not JSON", "BadRequestError")
    if body.get("model", state.model) != state.model:
        return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
    try:
        req = _Request.parse(body)
    except (TypeError, ValueError) as e:
        return _error(400, f"request body: {e}", "BadRequestError")
    state.requests += 1
    number = state.requests
    if script.http_error_every and number % script.http_error_every == 0:
        return _error(500, "fake engine: scripted internal error", "InternalServerError")
    state.inflight += 1
    state.max_inflight = max(state.max_inflight, state.inflight)
    state.live[number] = [t0, None]
    resp = web.StreamResponse(headers={
        "Content-Type": ("text/event-stream; charset=utf-8" if req.stream
                         else "application/json"),
        # The truth a benchmark compares with, and the arrival on CLOCK_MONOTONIC (a client's
        # perf_counter on Linux), which splits a measured TTFT into dispatch and server time.
        "x-fake-ttft-ms": str(script.ttft_ms), "x-fake-tpot-ms": str(script.tpot_ms),
        "x-fake-request-number": str(number), "x-fake-t0": repr(t0)})
    try:
        if script.stall_requests:
            await asyncio.Event().wait()
        await resp.prepare(request)
        served = _Served(number=number, prompt=req.prompt_text[:64], arrival=t0)
        await _stream(resp, state, req, t0=t0, number=number, served=served)
        await resp.write_eof()
        served.eof = _now()
        state.served.append(served)
    except ConnectionResetError:
        pass  # the client went away (its own timeout, or a chunk it rejected)
    finally:
        state.inflight -= 1
        state.live.pop(number, None)
    return resp


@dataclass(frozen=True)
class _Completion:
    """What one request gets: its token ids, the chunks they are streamed in (the index of
    each chunk's last token) and how it ends."""

    request: _Request
    head: str  # the fields every chunk opens with, as a JSON object left open
    output_ids: list[int]
    ends: list[int]
    finish: str

    @property
    def stream(self) -> bool:
        return self.request.stream

    @property
    def words(self) -> list[str]:
        return self.request.words

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def usage(self) -> dict[str, int]:
        n, prompt_tokens = len(self.output_ids), len(self.prompt_ids)
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n,
                "completion_tokens": n}

    def text(self, start: int, end: int) -> str:
        return "".join(" " + self.words[t % len(self.words)] for t in range(start, end + 1)
                       if self.output_ids[t] != EOS_ID)

    def chunk(self, i: int, start: int, text: str) -> bytes:
        """Chunk i of the stream, as vLLM writes it."""
        end = self.ends[i]
        reason = json.dumps(self.finish) if i == len(self.ends) - 1 else "null"
        ids = ""
        if self.request.return_token_ids:
            ids = (f',"prompt_token_ids":{_compact(self.prompt_ids) if i == 0 else "null"},'
                   f'"token_ids":{_compact(self.output_ids[start:end + 1])}')
        return (f'data: {self.head},"choices":[{{"index":0,"text":{json.dumps(text)},'
                f'"logprobs":null,"finish_reason":{reason},"stop_reason":null'
                f'{ids}}}]}}\n\n').encode()

    def closing(self, texts: list[str]) -> bytes:
        """The whole answer when not streamed, else the usage chunk (when asked) and [DONE]."""
        if not self.stream:
            choice = {"index": 0, "text": "".join(texts), "logprobs": None,
                      "finish_reason": self.finish, "stop_reason": None}
            if self.request.return_token_ids:
                choice.update(prompt_token_ids=self.prompt_ids, token_ids=self.output_ids)
            return (f'{self.head},"choices":[{json.dumps(choice)}],"usage":'
                    f'{json.dumps(self.usage)}}}').encode()
        tail = ""
        if self.request.include_usage:
            tail = (f'data: {self.head},"choices":[],"usage":'
                    f'{json.dumps(self.usage, separators=(",", ":"))}}}\n\n')
        return (tail + "data: [DONE]\n\n").encode()


def _plan(state: _State, req: _Request) -> _Completion:
    script = state.script
    max_tokens = req.max_tokens
    n = max_tokens
    if script.output_tokens is not None and not req.ignore_eos:
        n = min(script.output_tokens, max_tokens)
    # Token i of the output is word i of the prompt, cyclically: ids follow from the prompt
    # alone, so every trial of a workload gets the same baseline tokens.
    words = req.words
    output_ids = [token_id(words[t % len(words)]) for t in range(n)]
    finish = "length" if n == max_tokens else "stop"
    if finish == "stop":
        output_ids[-1] = EOS_ID  # counted in usage, as vLLM counts it, with no text
    head = json.dumps({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                       "created": int(time.time()), "model": state.model},
                      separators=(",", ":"))[:-1]  # open: each chunk appends its fields
    return _Completion(request=req, head=head, output_ids=output_ids,
                       ends=chunk_ends(n, script.tokens_per_chunk), finish=finish)


class _Pace:
    """When each chunk is due, against absolute deadlines: a late wake-up never delays the
    tokens after it. Under the load model, K and the step time follow the batch at every
    step, as vLLM's scheduler decides them; otherwise they are fixed when the request starts."""

    def __init__(self, state: _State, t0: float, number: int) -> None:
        self.state, self.t0, self.number = state, t0, number
        self.load_model = state.script.load_model
        self._step(t0)
        self.deadline = t0 + state.script.ttft_ms / 1000.0

    def _step(self, t: float) -> None:
        # On the wall clock, the batch is whoever is in flight now; on a virtual one, ties
        # at `t` are counted from the requests' times (_State.batch_at), never by arrival order.
        batch = self.state.batch_at(t, self.number) if _VIRTUAL else self.state.inflight
        self.k = _k_for_batch(self.state, batch)
        self.tpot_ms = _effective_tpot_ms(self.state.script, self.k, batch)

    def due(self, i: int, ends: list[int]) -> float:
        if not self.load_model:
            self.deadline = self.t0 + (self.state.script.ttft_ms + ends[i] * self.tpot_ms) / 1e3
        elif i > 0:
            self._step(self.deadline)
            self.deadline += (ends[i] - ends[i - 1]) * self.tpot_ms / 1000.0
        if i == len(ends) - 1 and self.number in self.state.live:
            self.state.live[self.number][1] = self.deadline
        return self.deadline


def _count_chunk(state: _State, i: int, k: int, deadline: float) -> None:
    """vLLM's spec-decode counters for a chunk after the first, and how late it was written."""
    if i > 0 and k:
        state.drafts += 1
        state.draft_tokens += k
        rates = state.script.drafter_rates
        if rates is None:
            state.accepted += k * state.script.accept_rate
            return _lag(state, deadline)
        accepted, before = 0, 1.0
        for rate in rates[:k]:  # position i+1 is accepted, given i was, at r_{i+1} / r_i
            if rate <= 0 or state.rng.random() >= rate / before:
                break
            accepted, before = accepted + 1, rate
        state.accepted += accepted
        for pos in range(accepted):
            state.accepted_per_pos[pos] += 1
    _lag(state, deadline)


def _lag(state: _State, deadline: float) -> None:
    lag_s = _now() - deadline
    state.lag_sum_s += lag_s
    state.lag_count += 1
    state.lag_max_s = max(state.lag_max_s, lag_s)


async def _stream(resp: web.StreamResponse, state: _State, req: _Request, *,
                  t0: float, number: int, served: _Served) -> None:
    """Write the completion on the script's schedule, as vLLM's stream (or one JSON body)."""
    script = state.script
    done = _plan(state, req)
    pace = _Pace(state, t0, number)
    ends = done.ends
    texts: list[str] = []
    for i, end in enumerate(ends):
        # The first and last chunk bound TTFT and TPOT, so only they pay for a precise wake-up.
        deadline = pace.due(i, ends)
        await _sleep_until(deadline, precise=i in (0, len(ends) - 1))
        if (script.die_after_requests is not None and number > script.die_after_requests
                and i >= len(ends) // 2):
            _log("EngineCore encountered a fatal error (scripted die_after_requests).", "ERROR")
            os._exit(1)
        if script.malformed_every and number % script.malformed_every == 0 and i > 0:
            await resp.write(b'data: {"choices": [{"text": \n\n')
            return
        start = ends[i - 1] + 1 if i else 0
        text = done.text(start, end)
        _count_chunk(state, i, pace.k, deadline)
        if done.stream:
            await resp.write(done.chunk(i, start, text))
            if i == 0:
                served.first_write = _now()
        else:
            texts.append(text)
    served.tokens = len(done.output_ids)
    await resp.write(done.closing(texts))


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": FAKE_VERSION})  # open, as vLLM's /version is


async def _models(request: web.Request) -> web.Response:
    state: _State = request.app["state"]
    if _unauthorized(request, state):
        return web.json_response({"error": "Unauthorized"}, status=401)
    return web.json_response({"object": "list", "data": [
        {"id": state.model, "object": "model", "created": int(state.created),
         "owned_by": "vllm", "root": state.model, "max_model_len": 4096}]})


async def _metrics(request: web.Request) -> web.Response:
    s: _State = request.app["state"]
    labels = f'model_name="{s.model}",engine="0"'
    out = ["# TYPE vllm:num_requests_running gauge",
           f"vllm:num_requests_running{{{labels}}} {float(s.inflight)}"]
    if s.spec_tokens:
        for name, value in (("num_drafts", s.drafts), ("num_draft_tokens", s.draft_tokens),
                            ("num_accepted_tokens", s.accepted)):
            out += [f"# TYPE vllm:spec_decode_{name} counter",
                    f"vllm:spec_decode_{name}_total{{{labels}}} {float(value)}",
                    f"vllm:spec_decode_{name}_created{{{labels}}} {s.created}"]
        out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        for pos in range(s.spec_tokens):
            count = (s.accepted_per_pos[pos] if s.script.drafter_rates is not None
                     else s.drafts * s.script.accept_rate)
            out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},'
                       f'position="{pos}"}} {float(count)}')
    # Not vLLM's: what the tests and the fidelity benchmark check the client against.
    out += [f"fake:inflight {s.inflight}", f"fake:max_inflight {s.max_inflight}",
            f"fake:requests_total {s.requests}", f"fake:emit_lag_seconds_sum {s.lag_sum_s}",
            f"fake:emit_lag_seconds_count {s.lag_count}",
            f"fake:emit_lag_seconds_max {s.lag_max_s}"]
    return web.Response(text="\n".join(out) + "\n", content_type="text/plain")


async def _reset_stats(request: web.Request) -> web.Response:
    """Start a fresh window for max in-flight and emission lag (one per measured level)."""
    s: _State = request.app["state"]
    s.max_inflight, s.lag_sum_s, s.lag_count, s.lag_max_s = s.inflight, 0.0, 0, 0.0
    s.served = []
    return web.Response(status=204)


async def _served(request: web.Request) -> web.Response:
    """Every streamed request completed since the last reset: arrival, first write, end."""
    return web.json_response([{k: v for k, v in asdict(s).items() if v is not None}
                              for s in request.app["state"].served])


async def _script(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].script.model_dump())


async def _serve(state: _State, host: str, port: int) -> None:
    _stamp_arrivals()
    app = web.Application(middlewares=[_arrival])
    app["state"] = state
    app.add_routes([web.get("/health", _health), web.get("/version", _version),
                    web.get("/metrics", _metrics),
                    web.get("/v1/models", _models), web.post("/v1/completions", _completions),
                    web.post("/fake/reset_stats", _reset_stats), web.get("/fake/script", _script),
                    web.get("/fake/served", _served)])
    # A short shutdown timeout: a stalled request must not hold up the engine's teardown.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    # The lines vLLM (uvicorn) prints once it listens; tests read the pid and URL from them.
    _log(f"Starting vLLM server on http://{host}:{port}")
    print(f"INFO:     Started server process [{os.getpid()}]", file=sys.stderr)
    print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT,) if state.script.ignore_sigterm else (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    _log("Shutting down FastAPI HTTP server.")
    if not _VIRTUAL:  # its grace period is virtual time, which stands still for a lone server
        await runner.cleanup()
    _exit(state.child)


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
    _log(f"vLLM API server version {FAKE_VERSION}")
    _log(f"args: model={args.model!r} ignored={ignored!r} script={script.model_dump_json()}")
    spec = args.speculative_config or {}  # the --speculative-config JSON, read once here
    settings = ProposerSettings.of(TrialConfig(speculative_config=spec))
    spec_tokens = _spec_tokens(settings)
    if settings is not None:
        _log(f"SpeculativeConfig(method={settings.method!r}, num_spec_tokens={spec_tokens})")
    _log_path(script, spec_method=settings.method if settings else None,
              no_async="--no-async-scheduling" in ignored)
    crash = script.crash_on_start or (
        f"ValueError: fake rejection of {script.crash_for_spec}" if script.crash_for_spec
        and spec and all(spec.get(k) == v for k, v in script.crash_for_spec.items()) else None)
    if crash:
        _log("EngineCore failed to start.", "ERROR")
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
                  else lambda *_: _exit(children[0] if children else None))
    if script.child_process:
        # Same process group, so only a group kill reaches it if we die first.
        children.append(subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(1e9)"], stdin=subprocess.DEVNULL))
    child = children[0] if children else None
    if script.hang_before_health:
        while True:
            time.sleep(3600)
    time.sleep(script.startup_s)
    state = _State(script=script, model=args.served_model_name or args.model,
                   api_key=args.api_key, spec_tokens=spec_tokens, child=child,
                   schedule=settings.k_schedule if settings else (),
                   accepted_per_pos=[0] * spec_tokens,
                   rng=random.Random(f"{script.drafter_seed}:{spec_tokens}"))
    if script.virtual_clock:
        _run_on_virtual_clock(script.virtual_clock, _serve(state, args.host, args.port))
    elif args.fake_loop == "uvloop":
        import uvloop

        uvloop.run(_serve(state, args.host, args.port))
    else:
        asyncio.run(_serve(state, args.host, args.port))


def _run_on_virtual_clock(path: str, coro) -> None:
    from tuner.testing.fake_clock import VirtualClock

    global _now, _VIRTUAL
    clock = VirtualClock(path)
    _now, _VIRTUAL = clock.now, True
    loop = clock.new_event_loop(alone=False)
    asyncio.set_event_loop(loop)
    loop.run_until_complete(coro)


if __name__ == "__main__":
    main()
