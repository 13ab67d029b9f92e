"""The request schedule (tuner/measure/request_schedule.py): one per study, every launch sends
it; distinct prompts, disjoint across levels and warm-ups, in a fixed order; shortened, never
wrapped, where the data holds too few, unless --allow-repeats.
"""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.measure import request_schedule as rs
from tuner.records.configs import MeasureSettings, Prompt, RequestSchedule, Workload, WorkloadSpec


def _workload(n: int, *, name: str = "instructcoder", num_prompts: int = 4) -> Workload:
    prompts = tuple(Prompt(prompt=f"p{i}", prompt_len=2, output_len=32) for i in range(n))
    return Workload(spec=WorkloadSpec(name=name, num_prompts=num_prompts), prompts=prompts)


def _all(schedule: RequestSchedule) -> list[int]:
    return [i for lv in schedule.levels for i in lv.warmups + lv.measured]


def test_every_request_of_a_launch_gets_a_prompt_of_its_own_in_a_fixed_order():
    # The README's main job: c=1 (1 warm-up + 4), c=4 (4 warm-ups + 8), 17 distinct prompts.
    settings = MeasureSettings(concurrencies=(1, 4), requests_per_slot=2)
    wl = _workload(194)
    schedule, note = rs.build(wl, settings)
    assert note is None
    one, four = schedule.level(1), schedule.level(4)
    assert (one.warmups, one.measured) == ((0,), (1, 2, 3, 4))
    assert (four.warmups, four.measured) == ((5, 6, 7, 8), tuple(range(9, 17)))
    assert sorted(_all(schedule)) == list(range(17)) and schedule.requests == 17
    assert schedule.workload_digest == wl.digest and not schedule.allow_repeats
    # Built again from the same workload and settings: the same schedule, so every launch of
    # a study (and `tuner bench` with its options) sends the same requests.
    assert rs.build(wl, settings)[0] == schedule
    assert RequestSchedule.model_validate(schedule.model_dump(mode="json")) == schedule
    assert [p.prompt for p in rs.measured(wl, four)] == [f"p{i}" for i in range(9, 17)]
    warm = rs.warmups(wl, four, settings)
    assert [p.output_len for p in warm] == [settings.warmup_output_len] * 4


def test_too_few_prompts_shorten_every_level_in_proportion_never_wrap():
    settings = MeasureSettings(concurrencies=(1, 4, 8), requests_per_slot=4)
    wl = _workload(40, num_prompts=4)  # asks 1+4, 4+16, 8+32: 65 requests
    schedule, note = rs.build(wl, settings)
    ids = _all(schedule)
    assert len(ids) == len(set(ids)) == 40  # no prompt twice, the data used up
    assert [len(lv.warmups) for lv in schedule.levels] == [1, 4, 8]  # warm-ups kept
    measured = [len(lv.measured) for lv in schedule.levels]
    assert measured == [2, 8, 17]  # 4:16:32 of the 27 left: 2.08, 8.31, 16.62
    assert [lv.asked for lv in schedule.levels] == [4, 16, 32]
    assert note is not None and "Levels shortened so no engine sees a prompt twice" in note
    assert "c=1 2 of 4, c=4 8 of 16, c=8 17 of 32" in note
    assert "--dataset-path FILE with the full dataset, or --allow-repeats" in note


def test_a_level_keeps_at_least_one_measured_request_or_the_command_is_refused():
    settings = MeasureSettings(concurrencies=(1, 4), requests_per_slot=4)
    schedule, _ = rs.build(_workload(7), settings)  # 5 warm-ups, 2 rooms
    assert [len(lv.measured) for lv in schedule.levels] == [1, 1]
    with pytest.raises(ConfigError, match="has no prompts to send"):
        rs.build(_workload(0), settings.model_copy(update={"allow_repeats": True}))
    with pytest.raises(ConfigError) as err:
        rs.build(_workload(6, name="custom"), settings)
    text = str(err.value)
    assert "workload 'custom' has 6 distinct prompts" in text and "--allow-repeats" in text
    assert "5 warm-ups and at least one measured request each" in text


def test_allow_repeats_wraps_the_pool_and_says_so():
    settings = MeasureSettings(concurrencies=(1, 4), requests_per_slot=2, allow_repeats=True)
    schedule, note = rs.build(_workload(10), settings)
    ids = _all(schedule)
    assert len(ids) == 17 and ids == [i % 10 for i in range(17)] and schedule.allow_repeats
    assert note is not None and "7 of the 17 requests each engine sends repeat a prompt" in note
    # With enough prompts, allowing repeats changes nothing.
    full, quiet = rs.build(_workload(194), settings)
    assert quiet is None and len(set(_all(full))) == 17


def test_a_stored_schedule_refuses_another_workload():
    schedule, _ = rs.build(_workload(30), MeasureSettings())
    rs.check_workload(schedule, _workload(30))
    with pytest.raises(ConfigError, match="request schedule was built for workload"):
        rs.check_workload(schedule, _workload(31))


def test_the_workload_sample_takes_prompts_no_level_sends_and_shrinks_to_what_is_left():
    settings = MeasureSettings(concurrencies=(1, 4), requests_per_slot=2, sample_prompts=64)
    schedule, note = rs.build(_workload(194), settings)
    assert note is None and schedule.sample == tuple(range(17, 81))
    assert schedule.sample_concurrency == 16 and schedule.requests == 17  # sent by one launch
    assert not set(schedule.sample) & set(_all(schedule))
    assert schedule.without_sample().sample == () and schedule.without_sample().levels == \
        schedule.levels
    # A short workload: the sample leaves as many prompts as the levels send (17) for an
    # out-of-sample check, and says so.
    short, note = rs.build(_workload(40), settings)
    assert short.sample == tuple(range(17, 23)) and note is None  # bench never sends it
    said = rs.sample_note(_workload(40), short, settings)
    assert "holds 6 of the 64 prompts" in said and "17 are kept" in said
    none, _ = rs.build(_workload(34), settings)
    assert "is empty (64 prompts asked for)" in rs.sample_note(_workload(34), none, settings)
    assert settings.pool_size(_workload(40).spec.num_prompts) == 17 + 64 + 17
    assert rs.build(_workload(40), MeasureSettings(concurrencies=(1, 4), requests_per_slot=2,
                                                   sample_prompts=0))[0].sample == ()


# --- tuner verify: the study's levels over prompts it never sent ----------------------------
def test_used_takes_every_level_s_prompts_and_the_workload_sample():
    schedule, _ = rs.build(_workload(40), MeasureSettings(concurrencies=(1, 2)))
    assert schedule.sample == tuple(range(15, 25))  # what the levels leave beside a check
    assert rs.used(schedule) == frozenset(_all(schedule)) | set(schedule.sample)
    assert rs.used(schedule.without_sample()) == frozenset(_all(schedule))


def test_a_fresh_schedule_keeps_the_study_s_levels_and_counts_and_sends_none_of_its_prompts():
    settings = MeasureSettings(concurrencies=(1, 4), requests_per_slot=2, sample_prompts=0)
    wl = _workload(60)
    study, _ = rs.build(wl, settings)  # 17 requests, indices 0-16
    exclude = rs.used(study) | {20}  # and one more the study sent (a sample)
    fresh = rs.fresh(wl, study, exclude=exclude)
    assert [lv.concurrency for lv in fresh.levels] == [1, 4]
    assert [(len(lv.warmups), len(lv.measured)) for lv in fresh.levels] == [(1, 4), (4, 8)]
    assert all(lv.asked is None for lv in fresh.levels)
    ids = _all(fresh)
    assert len(ids) == len(set(ids)) == 17 and not set(ids) & exclude
    assert fresh.workload_digest == wl.digest and not fresh.allow_repeats
    assert rs.fresh(wl, study, exclude=exclude) == fresh  # every launch sends the same
    more = rs.fresh(wl, study, exclude=exclude, measured=10)  # --num-prompts 10
    assert [len(lv.measured) for lv in more.levels] == [10, 10]


def test_a_fresh_schedule_is_shortened_where_too_few_unsent_prompts_are_left_or_refused():
    settings = MeasureSettings(concurrencies=(1, 4), requests_per_slot=2, sample_prompts=0)
    wl = _workload(27)
    study, _ = rs.build(wl, settings)  # 17 sent: 10 left for 5 warm-ups and 12 measured
    fresh = rs.fresh(wl, study, exclude=rs.used(study))
    assert [len(lv.warmups) for lv in fresh.levels] == [1, 4]
    assert [len(lv.measured) for lv in fresh.levels] == [2, 3]  # 4:8 of the 5 left
    assert [lv.asked for lv in fresh.levels] == [4, 8]
    assert not set(_all(fresh)) & rs.used(study)
    with pytest.raises(ConfigError, match="holds 6 prompts the study never sent"):
        rs.fresh(_workload(23), study, exclude=rs.used(study))


def test_the_prompts_a_study_sent_are_found_in_a_longer_pool_by_their_text():
    settings = MeasureSettings(concurrencies=(1,), requests_per_slot=2, sample_prompts=0)
    sent = _workload(6)
    study, _ = rs.build(sent, settings)  # 1 warm-up + 4: p0-p4
    # The pool holds the same texts in another order, p2 twice.
    texts = ["x0", "p3", "p2", "x1", "p0", "p2", "p5", "p1", "p4", "x2"]
    pool = Workload(spec=sent.spec, prompts=tuple(
        Prompt(prompt=t, prompt_len=2, output_len=32) for t in texts))
    assert rs.sent_before(pool, sent, study) == frozenset({1, 2, 4, 5, 7, 8})
