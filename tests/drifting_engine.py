"""The fake engine (tuner.testing.fake_engine) with a speed that drifts as it serves requests,
for the tests of a level measured in windows (tuner.measure.windows).

$DRIFT_ENGINE (JSON) sets it: request number k (counted from 1 as the fake counts them) streams
at tpot_ms x (1 + extra x max(0, 1 - k / settle_after) + grow x k). `extra` alone: the first
requests are slow and the engine settles after `settle_after` of them; `grow`: every request
is slower than the last, forever. Each request keeps the TPOT it started with. Everything else
is the fake's. Run it as a script: `python tests/drifting_engine.py --port 8000`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tuner.testing import fake_engine as fake
from tuner.testing import fake_pace, fake_script

ENV = "DRIFT_ENGINE"
SCRIPT = Path(__file__).resolve()


def tpot_ms(number: int, base_ms: float, drift: dict[str, float]) -> float:
    fade = max(0.0, 1.0 - number / max(drift.get("settle_after", 1.0), 1e-9))
    return base_ms * (1.0 + drift.get("extra", 0.0) * fade + drift.get("grow", 0.0) * number)


def engine_spec(drift: dict[str, float], **kwargs: Any):
    """fake_script.engine_spec, launching this script with `drift`."""
    env = {ENV: json.dumps(drift), **kwargs.pop("env", {})}
    return fake_script.engine_spec(vllm_cmd=(sys.executable, str(SCRIPT)), env=env, **kwargs)


class _DriftingPace(fake_pace.Pace):
    """The fake's pace, at the TPOT the drift gives the request as it starts."""

    drift: dict[str, float] = {}

    def __init__(self, state: Any, t0: float, number: int) -> None:
        super().__init__(state, t0, number)
        self.fixed_tpot_ms = tpot_ms(state.requests, state.script.tpot_ms, self.drift)

    def due(self, i: int, ends: list[int]) -> float:
        self.deadline = self.t0 + (self.state.script.ttft_ms
                                   + ends[i] * self.fixed_tpot_ms) / 1000.0
        return self.deadline


if __name__ == "__main__":
    _DriftingPace.drift = json.loads(os.environ.get(ENV) or "{}")
    fake_pace.Pace = _DriftingPace  # the fake server's _stream reads fake_pace.Pace per request
    fake.main()
