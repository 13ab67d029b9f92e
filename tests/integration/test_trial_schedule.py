"""A trial sends the request schedule (tuner/measure/trial.py with
tuner/measure/request_schedule.py), on the fake engine: every launch at a level gets the same
requests in the same order, no engine is sent a prompt twice, and a fake that learns from
repeated prompts (as suffix decoding does, tests/memorizing_engine.py) gains nothing under
the schedule; only --allow-repeats lets it.
"""

from __future__ import annotations

import json
from pathlib import Path

import memorizing_engine
import pytest
from conftest import fake_engine_spec

from tuner.measure import request_schedule
from tuner.measure import trial as runner
from tuner.records.configs import MeasureSettings, Prompt, TrialConfig, Workload, WorkloadSpec
from tuner.records.results import BenchResult
from tuner.tokens import FILE_NAME, TokenCapture

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}


def _workload(n: int, *, output_len: int = 24) -> Workload:
    prompts = tuple(Prompt(prompt=f"q{i} " + " ".join(f"w{i}x{j}" for j in range(6)),
                           prompt_len=7, output_len=output_len) for i in range(n))
    return Workload(spec=WorkloadSpec(name="random", num_prompts=4), prompts=prompts)


def _measure(tmp_path: Path, spec, config: TrialConfig, workload: Workload,
             settings: MeasureSettings) -> tuple[BenchResult, TokenCapture, list[dict]]:
    out = runner.measure_outcome(spec, config, workload, settings, str(tmp_path))
    assert out.failure is None, out.failure
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    return out.result, TokenCapture.load(tmp_path / FILE_NAME), records


def _measured_prompts(capture: TokenCapture, c: int) -> list[tuple[int, ...]]:
    return [tuple(r.prompt.tolist()) for r in
            sorted(capture.level(c, warmup=False), key=lambda r: r.index)]


def test_every_launch_at_a_level_gets_the_same_requests_and_no_prompt_twice(tmp_path):
    settings = MeasureSettings(concurrencies=(1, 4), requests_per_slot=2, stability_pct=50.0)
    wl = _workload(60)
    plain = _measure(tmp_path / "plain", fake_engine_spec(), TrialConfig(), wl, settings)
    spec = _measure(tmp_path / "ngram", fake_engine_spec(accept_rate=0.5),
                    TrialConfig(speculative_config=NGRAM), wl, settings)
    for c in (1, 4):
        # The same prompt token ids in the same order at each level, in both launches.
        assert _measured_prompts(plain[1], c) == _measured_prompts(spec[1], c)
        assert len(_measured_prompts(plain[1], c)) == (4 if c == 1 else 8)
        assert plain[0].level(c).prompts_digest == spec[0].level(c).prompts_digest
        assert plain[0].level(c).reused_prompts == spec[0].level(c).reused_prompts == 0
        # Three fixed windows of the level's own requests, nothing sent beyond them.
        level = spec[0].level(c)
        assert level.stable_windows == 3 and len(level.windows) == 3
        assert level.num_requests == len(_measured_prompts(spec[1], c))
    assert plain[0].level(1).prompts_digest != plain[0].level(4).prompts_digest
    for _, capture, records in (plain, spec):
        sent = [tuple(r.prompt.tolist()) for r in capture.requests]
        assert len(sent) == len(set(sent)) == 17  # warm-ups included: no prompt twice
        # In send order: each level's warm-ups first, never measured, then its requests.
        assert [(r["concurrency"], r["warmup"]) for r in records] == \
            [(1, True)] + [(1, False)] * 4 + [(4, True)] * 4 + [(4, False)] * 8
    # What was sent is the schedule, prompt for prompt.
    schedule, _ = request_schedule.build(wl, settings)
    texts = [p.prompt for p in request_schedule.measured(wl, schedule.level(4))]
    assert texts == [wl.prompts[i].prompt for i in range(9, 17)]


def test_a_schedule_handed_in_is_what_the_launch_sends(tmp_path):
    settings = MeasureSettings(concurrencies=(2,), num_requests=4, num_warmups=1)
    wl = _workload(30)
    built, _ = request_schedule.build(wl, settings)
    reversed_ = built.model_copy(update={"levels": (built.levels[0].model_copy(
        update={"measured": tuple(reversed(built.levels[0].measured))}),)})
    _, forward, _ = _measure(tmp_path / "a", fake_engine_spec(), TrialConfig(), wl, settings)
    out = runner.measure_outcome(fake_engine_spec(), TrialConfig(), wl, settings,
                                 str(tmp_path / "b"), schedule=reversed_)
    assert out.failure is None, out.failure
    backward = TokenCapture.load(tmp_path / "b" / FILE_NAME)
    assert _measured_prompts(backward, 2) == _measured_prompts(forward, 2)[::-1]
    # A schedule that would send a prompt twice, without --allow-repeats: a failed trial.
    twice = built.model_copy(update={"levels": (built.levels[0].model_copy(
        update={"measured": (1, 2, 1, 3)}),)})
    out = runner.measure_outcome(fake_engine_spec(), TrialConfig(), wl, settings,
                                 str(tmp_path / "c"), schedule=twice)
    assert out.failure is not None and "sent before, without --allow-repeats" in \
        out.failure.reason


def test_an_engine_that_learns_from_repeats_gains_nothing_under_the_schedule(tmp_path,
                                                                            virtual_clock):
    # 12 distinct prompts; the level asks for 1 warm-up and 24 measured requests. On the
    # virtual clock every TPOT is the script's exactly: 4 ms, 1 ms for a prompt seen before.
    settings = MeasureSettings(concurrencies=(1,), num_requests=24, warmup_output_len=4)
    wl = _workload(12, output_len=40)
    on_clock = {"tpot_ms": 4.0, "virtual_clock": virtual_clock.path}
    plain = _measure(tmp_path / "plain", fake_engine_spec(**on_clock), TrialConfig(), wl,
                     settings)[0].level(1)
    learner = _measure(tmp_path / "learner", memorizing_engine.engine_spec(4.0, **on_clock),
                       TrialConfig(), wl, settings)[0].level(1)
    # Shortened, never wrapped: 11 measured requests, each a prompt the engine never saw.
    assert plain.num_requests == learner.num_requests == 11
    assert learner.reused_prompts == 0
    assert plain.mean_tpot_ms == pytest.approx(4.0, abs=1e-6)
    assert learner.mean_tpot_ms == pytest.approx(4.0, abs=1e-6)
    # The control: with --allow-repeats the same fake is shown its answers and speeds up:
    # 13 of the 24 measured requests repeat a prompt, at a quarter of the TPOT.
    again = settings.model_copy(update={"allow_repeats": True})
    repeated = _measure(tmp_path / "repeats", memorizing_engine.engine_spec(4.0, **on_clock),
                        TrialConfig(), wl, again)[0].level(1)
    assert repeated.num_requests == 24 and repeated.reused_prompts == 24 - 11
    assert repeated.mean_tpot_ms == pytest.approx((11 * 4.0 + 13 * 1.0) / 24, abs=1e-6)
    assert repeated.mean_tpot_ms < 0.75 * plain.mean_tpot_ms


def test_the_launch_given_the_workload_sample_sends_it_after_its_levels_and_keeps_its_tokens(
        tmp_path):
    from tuner.tokens import SAMPLE_LEVEL

    settings = MeasureSettings(concurrencies=(1, 2), requests_per_slot=2, sample_prompts=10)
    wl = _workload(40)
    schedule, _ = request_schedule.build(wl, settings)
    out = runner.measure_outcome(fake_engine_spec(), TrialConfig(), wl, settings,
                                 str(tmp_path), schedule=schedule)
    assert out.failure is None, out.failure
    capture = TokenCapture.load(tmp_path / FILE_NAME)
    assert capture.levels() == [1, 2]  # the sample is no level
    sample = capture.sample()
    assert [r.index for r in sample] == list(range(10)) and not any(r.warmup for r in sample)
    sent = [tuple(r.prompt.tolist()) for r in capture.requests]
    assert len(sent) == len(set(sent))  # the sample's prompts are none of the levels'
    assert {r.concurrency for r in capture.requests} == {1, 2, SAMPLE_LEVEL}
    assert [lv.concurrency for lv in out.result.levels] == [1, 2]  # nothing measured on it
    assert len(capture.without_sample()) == len(capture) - 10
