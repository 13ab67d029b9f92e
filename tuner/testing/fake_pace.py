"""The fake engine's pace: the fake vLLM server's clock and state, when each chunk of a
request is due, and what each chunk adds to vLLM's spec-decode counters.

Token i of a request is due at arrival + ttft + i * tpot against absolute deadlines, so the
scripted TTFT and TPOT are what a client should measure at any concurrency; under the script's
load model, K and the step time follow the batch at every step, as vLLM's scheduler decides
them. On a virtual clock (tuner.testing.fake_clock) the deadlines are virtual and exact, and
the batch of a step is counted from the requests' virtual times.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from dataclasses import dataclass, field

from tuner.testing.fake_clock import VirtualClock
from tuner.testing.fake_script import DRAFTER_MAX_AGREEMENT, FakeScript

SPIN_S = 0.0015  # the precise wait's last stretch: timer slop of asyncio plus a VM's wake-up

# The server's clock: CLOCK_MONOTONIC, or a virtual clock's (use_virtual_clock).
now = time.monotonic
on_virtual_clock = False


def use_virtual_clock(clock: VirtualClock) -> None:
    """Serve on `clock`'s virtual time instead of CLOCK_MONOTONIC."""
    global now, on_virtual_clock
    now, on_virtual_clock = clock.now, True


@dataclass
class ServerState:
    """What the server knows as it runs: its script and model, the requests in flight, vLLM's
    spec-decode counters, how late it wrote, and what it served since the last reset."""

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
    # request number -> the agreement left where its next step starts (absent: a fresh one)
    agreement: dict[int, int] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    lag_sum_s: float = 0.0
    lag_count: int = 0
    lag_max_s: float = 0.0
    # Per request since the last reset, on CLOCK_MONOTONIC: what the server really did, the
    # truth benchmarks/fidelity.py holds the client's figures against.
    served: list[Served] = field(default_factory=list)
    # Requests in flight by number: [arrival, due time of the last chunk once it is known].
    live: dict[int, list] = field(default_factory=dict)

    def batch_at(self, t: float, number: int) -> int:
        """The batch of a step at time `t` for request `number`: it, and every request that
        arrived before `t` and has a chunk after it. Read from the requests' own times, not
        from which handler ran first, so a tie on a virtual clock always counts the same."""
        return 1 + sum(1 for n, (arrival, last) in self.live.items()
                       if n != number and arrival < t and (last is None or last > t))


@dataclass
class Served:
    """One completed request as GET /fake/served tells it, on CLOCK_MONOTONIC: when it
    arrived, when its first chunk was written (streamed only), its tokens and its end."""

    number: int
    prompt: str  # the prompt's first 64 characters, to match the client's records by
    arrival: float
    first_write: float | None = None
    tokens: int | None = None
    eof: float | None = None


def _k_for_batch(state: ServerState, batch: int) -> int:
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


class Pace:
    """When each chunk is due, against absolute deadlines: a late wake-up never delays the
    tokens after it. Under the load model, K and the step time follow the batch at every
    step, as vLLM's scheduler decides them; otherwise they are fixed when the request starts."""

    def __init__(self, state: ServerState, t0: float, number: int) -> None:
        self.state, self.t0, self.number = state, t0, number
        self.load_model = state.script.load_model
        self._step(t0)
        self.deadline = t0 + state.script.ttft_ms / 1000.0

    def _step(self, t: float) -> None:
        # On the wall clock, the batch is whoever is in flight now; on a virtual one, ties
        # at `t` are counted from the requests' times (ServerState.batch_at), never by arrival
        # order.
        batch = self.state.batch_at(t, self.number) if on_virtual_clock else self.state.inflight
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


def count_chunk(state: ServerState, number: int, i: int, k: int, deadline: float) -> None:
    """vLLM's spec-decode counters for a chunk after the first of request `number`, and how
    late it was written."""
    if i > 0 and k:
        state.drafts += 1
        state.draft_tokens += k
        if state.script.drafter_rates is None:
            state.accepted += k * state.script.accept_rate
            return _lag(state, deadline)
        left = state.agreement.pop(number, None)
        if left is None:
            left = _fresh_agreement(state.script, state.rng)
        accepted = min(left, k)
        if left > k:  # the bonus token agreed too: the next step starts inside the agreement
            state.agreement[number] = left - k - 1
        state.accepted += accepted
        for pos in range(accepted):
            state.accepted_per_pos[pos] += 1
    _lag(state, deadline)


def _fresh_agreement(script: FakeScript, rng: random.Random) -> int:
    """A drawn agreement length where the drafter was just corrected (FakeScript.drafter_rates)."""
    length, before = 0, 1.0
    for rate in script.drafter_rates or ():  # l >= i+1, given l >= i, at r_{i+1} / r_i
        if rate <= 0 or rng.random() >= rate / before:
            return length
        length, before = length + 1, rate
    rho = script.drafter_tail()
    while length < DRAFTER_MAX_AGREEMENT and rng.random() < rho:
        length += 1
    return length


def _lag(state: ServerState, deadline: float) -> None:
    lag_s = now() - deadline
    state.lag_sum_s += lag_s
    state.lag_count += 1
    state.lag_max_s = max(state.lag_max_s, lag_s)


async def sleep_until(deadline: float, *, precise: bool) -> None:
    """Wait until the server's clock reaches `deadline`; never return early."""
    while (wait_s := deadline - now()) > 0:
        if not precise or on_virtual_clock:  # virtual time has no timer slop to spin through
            await asyncio.sleep(wait_s)
        elif wait_s > SPIN_S:
            await asyncio.sleep(wait_s - SPIN_S)
        else:
            # asyncio rounds its epoll timeout up to whole milliseconds, so a timer fires up
            # to 1 ms late; the last stretch yields to other requests until the deadline.
            await asyncio.sleep(0)
