"""The fake engine (tuner.testing.fake_engine) that learns from what it served, as suffix
decoding's global tree does: a prompt it has answered before streams `speedup` times faster.
For the tests of the request schedule (tuner.measure.request_schedule): no engine may see a
prompt twice, so under the schedule this fake is exactly as fast as the plain one.

$MEMORIZE_ENGINE (JSON, {"speedup": 4.0}) sets it; everything else is the fake's. Run it as a
script: `python tests/memorizing_engine.py --port 8000`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tuner.testing import fake_completion, fake_pace, fake_script
from tuner.testing import fake_engine as fake

ENV = "MEMORIZE_ENGINE"
SCRIPT = Path(__file__).resolve()


def engine_spec(speedup: float, **kwargs: Any):
    """fake_script.engine_spec, launching this script with `speedup` on repeated prompts."""
    env = {ENV: json.dumps({"speedup": speedup}), **kwargs.pop("env", {})}
    return fake_script.engine_spec(vllm_cmd=(sys.executable, str(SCRIPT)), env=env, **kwargs)


_seen: set[str] = set()
_speedup = 1.0
_plain_plan = fake_completion.plan


def _remembering_plan(state: Any, req: Any) -> Any:
    """The fake's plan, noting on `state` whether this prompt was answered before; the pace
    built right after it (no await between them in the fake server's _stream) reads the note."""
    prompt = req.prompt_text
    state.repeat = prompt in _seen
    _seen.add(prompt)
    return _plain_plan(state, req)


class _MemorizingPace(fake_pace.Pace):
    def _step(self, t: float) -> None:
        super()._step(t)
        if getattr(self.state, "repeat", False):
            self.tpot_ms /= _speedup


if __name__ == "__main__":
    _speedup = float(json.loads(os.environ.get(ENV) or "{}").get("speedup", 1.0))
    # The fake server's _stream reads fake_completion.plan and fake_pace.Pace per request.
    fake_completion.plan = _remembering_plan
    fake_pace.Pace = _MemorizingPace
    fake.main()
