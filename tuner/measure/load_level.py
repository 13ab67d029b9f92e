"""Measure stage, a level of load: what every request of a level sends and when it is sent.

RequestSettings is what a caller asks of a level (the served model, the sampling, the time
limits, and a request rate for open-loop arrivals); poisson_arrivals draws the arrival times
as `vllm bench serve --request-rate` does; LoadLevel is one level as the load generator's
loops run it (tuner.measure.closed_loop, in one process or several:
tuner.measure.client_processes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.measure.loadgen_clock import Clock


@dataclass(frozen=True)
class RequestSettings:
    """What every request of a level sends, and how long it may take: the served model name
    and API key, the sampling (`temperature`, `top_p`, `top_k`, `min_p`, `ignore_eos`), and
    the time limits of one request and of the whole level; and when they are sent:
    `request_rate` (requests/s) makes the level open loop, request i sent at
    poisson_arrivals(n, request_rate, arrival_seed)[i], never more than the level's
    concurrency in flight (None: the closed loop)."""

    model: str
    api_key: str
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    ignore_eos: bool = False
    request_timeout_s: float = 300.0
    level_timeout_s: float = 3600.0
    request_rate: float | None = None
    arrival_seed: int = 0


@dataclass(frozen=True)
class LoadLevel:
    """One level as each client process runs it: where requests go, what they send, whether
    they are warm-up, the clock their start_s count on and when the level must have ended."""

    url: str
    settings: RequestSettings
    concurrency: int
    warmup: bool
    origin_s: float | None
    deadline: float | None
    # Open loop: request i's arrival, in seconds after t0 (poisson_arrivals); None: closed loop.
    arrivals: tuple[float, ...] | None = None
    clock: Clock | None = None  # the driver's, for client processes (None: the wall clock)


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> tuple[float, ...]:
    """When each of `n` requests arrives, in seconds from the start, at `rate` requests/s: as
    `vllm bench serve --request-rate` (burstiness 1, no ramp-up) draws them after
    np.random.seed(seed): exponential gaps (gamma, shape 1), summed, then scaled so the last
    arrives at n / rate (vLLM's normalisation); the first comes after one gap too."""
    import numpy as np

    if n <= 0:
        return ()
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"a request rate must be positive and finite, not {rate}")
    gaps = np.random.RandomState(seed).gamma(shape=1.0, scale=1.0 / rate, size=n)
    times = np.cumsum(gaps)
    times *= (n / rate) / times[-1]
    return tuple(float(t) for t in times)
