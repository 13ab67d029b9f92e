"""The fake engine's script: what the fake vLLM server (tuner.testing.fake_engine) does, its
timing, speculation counters and injected faults, and the EngineSpec that launches it with one.

A script travels to the fake as JSON, in $FAKE_ENGINE_SCRIPT (SCRIPT_ENV) or `--fake-script`.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

import tuner
from tuner.records.configs import EngineSpec

SCRIPT_ENV = "FAKE_ENGINE_SCRIPT"
# The longest agreement a simulated drafter draws (drafter_rates of 1.0 would never stop).
DRAFTER_MAX_AGREEMENT = 10_000


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
    # A model-based drafter (draft_model, EAGLE, MTP) at temperature 0, simulated: where the
    # drafter was just corrected it agrees with the target for a drawn length l, with
    # P(l >= i) = drafter_rates[i-1] (non-increasing), beyond the list at the last one's
    # conditional rate (rates[-1] / rates[-2]). The agreement carries over steps as a real
    # drafter's does: a step at K accepts min(l, K), and where l > K the next step starts
    # inside the agreement with l - K - 1 left (tuner.replay.drafter_k). Each request's
    # lengths are drawn (seeded by drafter_seed and K), so the counters spread as a real
    # engine's do; a step yields 1 + expected_accepted(K) tokens on average. Where set it
    # replaces accept_rate. Under the load model the drafter's cost is added to each
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
        """Draft tokens a step of K = k accepts on average: with a drafter, the agreement's
        tokens over the steps it takes at K, less the one token every step adds."""
        if self.drafter_rates is None:
            return k * self.accept_rate
        survival = [1.0, *self.drafter_rates]
        rho = self.drafter_tail()
        while survival[-1] > 1e-12 and len(survival) < DRAFTER_MAX_AGREEMENT:
            survival.append(survival[-1] * rho)
        steps = sum(survival[::k + 1])
        return sum(survival) / steps - 1.0

    def drafter_tail(self) -> float:
        """The agreement's conditional rate beyond drafter_rates."""
        rates = self.drafter_rates or (0.0,)
        before = rates[-2] if len(rates) > 1 else 1.0
        return rates[-1] / before if before > 0 else 0.0


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
