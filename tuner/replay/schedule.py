"""Replay stage, schedule: one level's closed loop played out over the engine's steps.

The load generator keeps `concurrency` requests in flight and sends the next one the moment one
finishes; the engine runs every request that has its first token in one decode step, costing
t(n, u) (tuner.replay.cost). This module plays that loop forward, step by step, with each
request's drafts from the replay (tuner.replay.acceptance):

- a request sent at time s reaches the engine `overhead_ms` later, is prefilled in the next
  step (`prefill_ms_per_token` per prompt token, which stalls every running request), and has
  its first token when that step ends;
- each decode step consumes one entry of its replayed draft lengths; its slot takes the next
  request when it finishes;
- the level runs from the first send to the last finish, as `vllm bench serve` measures it.

Means miss why this matters: speculative requests finish after very different numbers of steps,
so the last ones run in a shrinking batch, and nearly every later prefill stalls running
requests (docs/method.md). The same play tells the cost fit how many tokens a measured trial's
steps scored and how long prefills stalled them (`Schedule.coef_*`, `stall_ms`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

StepFn = Callable[[float, float], float]  # (tokens scored, non-uniform 0/1) -> step ms


@dataclass(frozen=True)
class Schedule:
    """A simulated level: its duration, per request its TTFT and TPOT, and what its decode
    steps held, for the cost fit: a request's decode time is
    a * steps + b * (tokens its steps scored) + m * (its non-uniform steps) + prefill stalls,
    and the coefficients are those sums over all requests per token they decoded (what the
    level's decode time per token, sum(e2e - TTFT) / sum(N - 1), weighs them by)."""

    duration_ms: float
    output_tokens: int
    ttft_ms: tuple[float, ...]  # per request
    tpot_ms: tuple[float, ...]  # per request with more than one output token
    coef_a: float  # sum over requests of their decode steps / sum of (N - 1)
    coef_b: float  # sum over requests and their steps of the tokens a step scored / sum (N - 1)
    coef_m: float  # sum of their steps that were not uniform / sum of (N - 1)
    stall_ms: float  # sum of prefill time of other requests inside their steps / sum (N - 1)
    steps: int  # engine steps in the level
    uniform_steps: int  # of those, steps where every request scored 1 + K
    # sum over requests of (e2e - TTFT) / sum of (N - 1): the level's decode time per token,
    # which weighs each request by the tokens it decoded, as throughput does (mean TPOT weighs
    # a request of 2 tokens, whose one gap may be a whole prefill of another, as much as one
    # of 64)
    decode_ms_per_token: float = 0.0
    # per request, its share of the level's engine time: each step's time split evenly among
    # the requests it served. They sum to the time the engine was busy, so a level played over
    # a resample of its requests takes about the sum of their shares (tuner.replay.forecast).
    share_ms: tuple[float, ...] = ()

    @property
    def mean_tpot_ms(self) -> float | None:
        return statistics.fmean(self.tpot_ms) if self.tpot_ms else None

    @property
    def mean_ttft_ms(self) -> float | None:
        return statistics.fmean(self.ttft_ms) if self.ttft_ms else None

    @property
    def output_throughput(self) -> float | None:
        """Output tokens per second over the level's duration."""
        return 1000.0 * self.output_tokens / self.duration_ms if self.duration_ms > 0 else None

    @property
    def uniform_share(self) -> float:
        return self.uniform_steps / self.steps if self.steps else 1.0

    @property
    def scored_per_step(self) -> float | None:
        """Tokens scored per step as the decode time per token weighs them (what the fit
        uses)."""
        return self.coef_b / self.coef_a if self.coef_a else None

    @property
    def mixed_per_step(self) -> float:
        return self.coef_m / self.coef_a if self.coef_a else 0.0


def simulate(drafts: Sequence[np.ndarray], lengths: Sequence[int], *, concurrency: int,
             k: int, step_ms: StepFn, prompts: Sequence[int] | None = None,
             prefill_ms_per_token: float = 0.0, overhead_ms: float = 0.0) -> Schedule:
    """Play one level forward.

    drafts[i]: request i's draft length at each of its decode steps (zeros without
    speculation); lengths[i]: its output tokens; prompts[i]: its prompt tokens; requests are
    sent in this order. `k` is the config's num_speculative_tokens (0 without speculation:
    every step uniform). A request reaches the engine `overhead_ms` after it is sent (the
    frontend's share of TTFT), is prefilled in the next step, which costs
    `prefill_ms_per_token` per prompt token more (for every request in it), and has its
    first token when that step ends."""
    if len(drafts) != len(lengths):
        raise ValueError(f"{len(drafts)} draft traces for {len(lengths)} requests")
    play = _Play(drafts, k=k, slots=max(1, concurrency),
                 prompts=list(prompts) if prompts is not None else [0] * len(lengths))
    play.send(0.0)
    waiting, decoding, sent_at = play.waiting, play.decoding, play.sent_at
    while waiting or decoding:
        admit = [i for i in waiting if sent_at[i] + overhead_ms <= play.now]
        if not admit and not decoding:
            play.now = min(sent_at[i] for i in waiting) + overhead_ms
            continue
        play.step(admit, step_ms, prefill_ms_per_token)
    return play.schedule(lengths)


class _Play:
    """The state of a level being played: who is waiting for its prefill, who decodes, and
    per request what its steps held so far."""

    def __init__(self, drafts: Sequence[np.ndarray], *, k: int, slots: int,
                 prompts: list[int]) -> None:
        n_req = len(drafts)
        self.k, self.slots, self.prompts = k, slots, prompts
        self.scored = [np.asarray(d, dtype=np.int64) + 1 for d in drafts]
        self.full = [np.asarray(d) == k for d in drafts]
        self.sent_at = [0.0] * n_req
        self.ttft = [0.0] * n_req
        self.pos = [0] * n_req
        self.n_steps = [0] * n_req
        self.n_sum = [0.0] * n_req
        self.mixed_sum = [0] * n_req
        self.stall = [0.0] * n_req
        self.busy = [0.0] * n_req  # ms spent in its decode steps
        self.share = [0.0] * n_req  # its share of the engine's time (Schedule.share_ms)
        self.sent, self.now, self.end = 0, 0.0, 0.0
        self.waiting: list[int] = []  # sent, not yet prefilled
        self.decoding: list[int] = []
        self.engine_steps = self.uniform = 0

    def send(self, at: float) -> None:
        """Fill the free slots with the next requests, sent at `at`."""
        while (self.sent < len(self.sent_at)
               and len(self.waiting) + len(self.decoding) < self.slots):
            self.sent_at[self.sent] = at
            self.waiting.append(self.sent)
            self.sent += 1

    def step(self, admit: list[int], step_ms: StepFn, prefill_ms_per_token: float) -> None:
        """One engine step: every decoding request advances, `admit` is prefilled."""
        decoding, pos = self.decoding, self.pos
        n = float(sum(int(self.scored[i][pos[i]]) for i in decoding))
        is_mixed = (self.k > 0 and bool(decoding)
                    and not all(bool(self.full[i][pos[i]]) for i in decoding))
        prefill = prefill_ms_per_token * sum(self.prompts[i] for i in admit)
        dt = step_ms(n, 1.0 if is_mixed else 0.0) + prefill
        self.now += dt
        if decoding:
            self.engine_steps += 1
            self.uniform += not is_mixed
        n_steps, n_sum, mixed_sum, stall, busy = (
            self.n_steps, self.n_sum, self.mixed_sum, self.stall, self.busy)
        for i in decoding:
            pos[i] += 1
            n_steps[i] += 1
            n_sum[i] += n
            mixed_sum[i] += is_mixed
            stall[i] += prefill
            busy[i] += dt
        served = decoding or admit
        for i in served:
            self.share[i] += dt / len(served)
        for i in admit:
            self.waiting.remove(i)
            self.ttft[i] = self.now - self.sent_at[i]
            decoding.append(i)
        finished = [i for i in decoding if pos[i] >= len(self.scored[i])]
        for i in finished:
            decoding.remove(i)
            self.end = self.now
        if finished:
            self.send(self.now)

    def schedule(self, lengths: Sequence[int]) -> Schedule:
        per = [i for i in range(len(lengths)) if lengths[i] > 1]
        decoded = sum(lengths[i] - 1 for i in per)

        def per_token(values: list[float]) -> float:
            return sum(values[i] for i in per) / decoded if decoded else 0.0

        return Schedule(
            duration_ms=self.end, output_tokens=int(sum(lengths)), ttft_ms=tuple(self.ttft),
            tpot_ms=tuple(self.busy[i] / (lengths[i] - 1) for i in per),
            coef_a=per_token(self.n_steps), coef_b=per_token(self.n_sum),
            coef_m=per_token(self.mixed_sum), stall_ms=per_token(self.stall),
            steps=self.engine_steps, uniform_steps=self.uniform,
            decode_ms_per_token=per_token(self.busy), share_ms=tuple(self.share))


def baseline_drafts(lengths: Sequence[int]) -> list[np.ndarray]:
    """Without speculation a request of N tokens takes N - 1 decode steps and drafts nothing."""
    return [np.zeros(max(0, n - 1), dtype=np.int16) for n in lengths]
