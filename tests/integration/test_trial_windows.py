"""A trial whose levels are measured in windows (tuner/measure/trial.py with
tuner/measure/windows.py), on a fake engine whose speed drifts (tests/drifting_engine.py):
an engine that settles is measured once it has, its settling windows kept as warm-up; one that
never settles stops at the time cap, marked not converged; with windows off a level is one
block, as before windows existed.
"""

from __future__ import annotations

import json
from pathlib import Path

import drifting_engine
from conftest import fake_engine_spec

from tuner.measure import trial as runner
from tuner.records import BenchResult, MeasureSettings, Prompt, TrialConfig, Workload, WorkloadSpec
from tuner.tokens import FILE_NAME, TokenCapture

C = 4
OUTPUT_LEN = 16


def _workload(n: int = 200) -> Workload:
    prompts = tuple(Prompt(prompt=f"q{i} " + " ".join(f"w{i}x{j}" for j in range(4)),
                           prompt_len=5, output_len=OUTPUT_LEN) for i in range(n))
    return Workload(spec=WorkloadSpec(name="random", num_prompts=8), prompts=prompts)


def _measure(tmp_path: Path, spec, settings: MeasureSettings
             ) -> tuple[BenchResult, list[dict], list[str]]:
    said: list[str] = []
    out = runner.measure_outcome(spec, TrialConfig(), _workload(), settings, str(tmp_path),
                                 progress=said.append)
    assert out.failure is None, out.failure
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    return out.result, records, said


def _windows_on(**update) -> MeasureSettings:
    # n = 24 at c=4: windows of 8 requests, two rounds of the 4 slots.
    fields = {"stability_pct": 10.0, "stability_max_s": 30.0, **update}
    return MeasureSettings(concurrencies=(C,), num_requests=24, warmup_output_len=4,
                           min_window_s=0.0, **fields)


def test_an_engine_that_settles_is_measured_once_it_has(tmp_path):
    # The first requests stream 3x slower, fading to the engine's speed over 40 requests.
    spec = drifting_engine.engine_spec({"extra": 2.0, "settle_after": 40}, tpot_ms=6.0)
    settings = _windows_on()
    result, records, said = _measure(tmp_path, spec, settings)
    (level,) = result.levels
    size = settings.window_requests(C, 8)
    assert size == 8
    assert level.converged is True and level.stability_pct <= 10.0
    assert level.stable_windows == 3 and len(level.windows) >= 5  # it settled after 2 or more
    assert len(level.windows) == len(level.window_tpot_ms)
    settling = len(level.windows) - 3
    # Early windows were slower than the settled ones: they are why it waited.
    assert level.window_tpot_ms[0] > 1.3 * level.window_tpot_ms[-1]
    assert level.windows[0] < level.windows[-1]
    assert level.num_requests == 3 * size and level.completed == 3 * size
    assert level.warmup_requests == C + settling * size
    assert level.measure_s >= level.duration > 0
    # The figures are those of the stable windows alone.
    measured = [r for r in records if not r["warmup"]]
    assert [r["index"] for r in measured] == list(range(3 * size))
    assert level.total_output_tokens == sum(r["output_tokens"] for r in measured)
    # The settling windows are warm-up, numbered after the short warm-ups, in send order.
    warm = [r for r in records if r["warmup"]]
    assert [r["index"] for r in warm] == list(range(C + settling * size))
    assert all(r["output_tokens"] <= 4 for r in warm[:C])
    assert all(r["output_tokens"] == OUTPUT_LEN for r in warm[C:])
    # One clock for the level: the stable windows' requests start after the settling ones.
    assert min(r["start_s"] for r in measured) > max(r["start_s"] for r in warm[C:])
    # The token capture follows the records, each with the budget its prompt was sent with.
    cap = TokenCapture.load(tmp_path / FILE_NAME)
    assert [(r.index, r.warmup) for r in cap.requests] == \
        [(r["index"], r["warmup"]) for r in records]
    assert [r.max_tokens for r in cap.requests] == \
        [4] * C + [OUTPUT_LEN] * (len(records) - C)
    assert len({(r.concurrency, r.index, r.warmup) for r in cap.requests}) == len(records)
    assert level.reused_prompts == 0
    line = next(x for x in said if x.startswith(f"c={C}:"))
    assert line.endswith(f" ({level.windows_text()})") and " windows, ±" in line


def test_an_engine_that_never_settles_stops_at_the_time_cap(tmp_path):
    # Every request streams slower than the one before: no three windows ever agree.
    spec = drifting_engine.engine_spec({"grow": 0.08}, tpot_ms=4.0)
    settings = _windows_on(stability_max_s=1.0)
    result, records, said = _measure(tmp_path, spec, settings)
    (level,) = result.levels
    assert level.converged is False and level.stability_pct > 10.0
    assert level.measure_s >= 1.0 and len(level.windows) >= 3
    assert list(level.windows) == sorted(level.windows, reverse=True)  # ever slower
    # No window started after the cap: the last one began before 1 s on the level's clock.
    last = [r for r in records if not r["warmup"]][-8:]
    assert min(r["start_s"] for r in last) < 1.0
    assert level.num_requests == 24 and level.warmup_requests == C + 8 * (len(level.windows) - 3)
    line = next(x for x in said if x.startswith(f"c={C}:"))
    assert f"(not converged: ±{level.stability_pct:.1f}% after " in line
    assert line.endswith(f"{len(level.windows)} windows)")


def test_with_windows_off_a_level_is_one_block_as_before(tmp_path):
    spec = fake_engine_spec(tokens_per_chunk=2)
    settings = MeasureSettings(concurrencies=(1, C), num_requests=6, warmup_output_len=4)
    assert settings.stability_pct == 0.0  # the record's default: off
    result, records, said = _measure(tmp_path, spec, settings)
    assert [(r["concurrency"], r["index"], r["warmup"]) for r in records] == \
        [(1, 0, True)] + [(1, i, False) for i in range(6)] + \
        [(C, i, True) for i in range(C)] + [(C, i, False) for i in range(6)]
    for level in result.levels:
        assert (level.windows, level.window_tpot_ms, level.stable_windows) == ((), (), 0)
        assert (level.stability_pct, level.converged, level.measure_s) == (None, None, None)
        assert level.num_requests == 6 and level.warmup_requests == level.concurrency
    assert [x for x in said if x.startswith("c=")] == [
        f"c={lv.concurrency}: {lv.output_throughput:.1f} tok/s, mean TPOT "
        f"{lv.mean_tpot_ms:.1f} ms, 6/6 ok" for lv in result.levels]
    # Prompts in pool order, no level's measured block drawn before its warm-up.
    cap = TokenCapture.load(tmp_path / FILE_NAME)
    assert len(cap) == len(records)
