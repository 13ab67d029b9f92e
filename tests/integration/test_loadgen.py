"""tuner/measure/loadgen.py against the fake engine on loopback, launched by the real Engine class.

The fake engine counts what it served (`fake:max_inflight` in its /metrics), scripts its
timing exactly, and injects the faults a real server shows: HTTP errors, broken chunks,
stalls, death mid-stream. Each must become a RequestRecord, never an exception.

Tests that check measured times run the fake and the load generator on a virtual clock
(the `virtual_clock` fixture, tuner.testing.fake_clock), where the script's TTFT and TPOT
are what the client stamps, exactly, however loaded the host is; on the wall clock only
bounds a load cannot break are checked (nothing is ever measured short).
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from tuner.errors import MeasurementFailed
from tuner.measure import load_level, loadgen
from tuner.measure.client_processes import client_processes


def _run(eng, prompts, *, concurrency: int, api_key: str | None = None,
         ignore_eos: bool = False, request_timeout_s: float = 10.0,
         level_timeout_s: float = 3600.0, **kwargs):
    settings = load_level.RequestSettings(
        model=eng.spec.served_model_name, api_key=api_key or eng.api_key, ignore_eos=ignore_eos,
        request_timeout_s=request_timeout_s, level_timeout_s=level_timeout_s)
    return loadgen.run_requests(eng.url, prompts, settings, concurrency=concurrency, **kwargs)


def _reset(eng) -> None:
    urllib.request.urlopen(urllib.request.Request(eng.url + "/fake/reset_stats", method="POST",
                                                  data=b""), timeout=5)


def test_closed_loop_keeps_exactly_c_in_flight(fake_engine, make_prompts, fake_stats,
                                               virtual_clock) -> None:
    done_order: list[int] = []
    with fake_engine(ttft_ms=100, tpot_ms=5, virtual_clock=virtual_clock.path) as eng:
        _reset(eng)
        records, wall_s = _run(eng, make_prompts(13, output_len=8), concurrency=3,
                               on_done=lambda r: done_order.append(r.index))
        stats = fake_stats(eng.url)
    # Never more than c at the server, and the loop did fill all c slots.
    assert stats["fake:max_inflight"] == 3
    assert stats["fake:requests_total"] == 13
    assert [r.index for r in records] == list(range(13))
    assert sorted(done_order) == list(range(13))
    assert all(r.ok and r.output_tokens == 8 and r.concurrency == 3 for r in records)
    assert all(not r.warmup for r in records)
    # 13 requests of 135 ms each, 3 at a time: 5 rounds.
    assert wall_s == pytest.approx(5 * 0.135, abs=1e-9)


def test_fewer_prompts_than_slots(fake_engine, make_prompts, fake_stats, virtual_clock) -> None:
    with fake_engine(ttft_ms=200, virtual_clock=virtual_clock.path) as eng:
        _reset(eng)
        records, _ = _run(eng, make_prompts(2), concurrency=8, warmup=True)
        assert fake_stats(eng.url)["fake:max_inflight"] == 2
    assert len(records) == 2 and all(r.ok and r.warmup for r in records)


def test_ttft_tpot_and_usage_match_the_script(fake_engine, make_prompts, virtual_clock) -> None:
    with fake_engine(ttft_ms=60, tpot_ms=8, virtual_clock=virtual_clock.path) as eng:
        records, _ = _run(eng, make_prompts(6, output_len=16), concurrency=2)
    for r in records:
        assert r.ok, r.error
        assert r.output_tokens == 16 and r.prompt_tokens == 5  # from the usage chunk
        assert len(r.chunk_gaps_s) == 15
        # Every request as the script has it: 60 ms to the first token, 8 ms per token after.
        assert r.ttft_s == pytest.approx(0.060, abs=1e-9)
        assert r.chunk_gaps_s == pytest.approx([0.008] * 15, abs=1e-9)
        assert r.e2e_s == pytest.approx(0.060 + 15 * 0.008, abs=1e-9)
        assert r.tpot_s == pytest.approx(0.008, abs=1e-9)


def test_nothing_is_measured_short_on_the_wall_clock(fake_engine, make_prompts) -> None:
    # The server never writes early, so however loaded the host, no figure is below the
    # script's (a load only ever adds time; the exact figures are the virtual clock's test).
    with fake_engine(ttft_ms=60, tpot_ms=8) as eng:
        records, _ = _run(eng, make_prompts(6, output_len=16), concurrency=2)
    for r in records:
        assert r.ok, r.error
        assert r.ttft_s >= 0.060 and r.e2e_s >= 0.060 + 15 * 0.008
        assert len(r.chunk_gaps_s) == 15


def test_several_tokens_per_chunk_keep_tpot_per_token(fake_engine, make_prompts,
                                                      virtual_clock) -> None:
    # As under speculation: the first chunk is one token, then 4 tokens per chunk.
    with fake_engine(ttft_ms=30, tpot_ms=5, tokens_per_chunk=4,
                     virtual_clock=virtual_clock.path) as eng:
        records, _ = _run(eng, make_prompts(3, output_len=21), concurrency=1)
    for r in records:
        assert r.ok and r.output_tokens == 21
        assert len(r.chunk_gaps_s) == 5  # chunks of 1, 4, 4, 4, 4, 4 tokens
        # TPOT is per token; a chunk gap (ITL) spans four of them.
        assert r.tpot_s == pytest.approx(0.005, abs=1e-9)
        assert r.chunk_gaps_s == pytest.approx([4 * 0.005] * 5, abs=1e-9)


def test_early_eos_counts_the_tokens_the_server_sent(fake_engine, make_prompts) -> None:
    with fake_engine(output_tokens=5) as eng:
        records, _ = _run(eng, make_prompts(2, output_len=50), concurrency=2)
        eos_ignored, _ = _run(eng, make_prompts(1, output_len=12), concurrency=1,
                              ignore_eos=True)
    assert [r.output_tokens for r in records] == [5, 5]
    assert eos_ignored[0].output_tokens == 12


def test_http_errors_become_errored_records(fake_engine, make_prompts) -> None:
    with fake_engine(http_error_every=2) as eng:
        records, _ = _run(eng, make_prompts(6), concurrency=1)
    failed = [r for r in records if not r.ok]
    assert len(records) == 6 and len(failed) == 3
    for r in failed:
        assert r.error.startswith("HTTP 500") and "scripted internal error" in r.error
        assert r.output_tokens == 0 and r.e2e_s is None and r.tpot_s is None


def test_malformed_chunks_become_errored_records(fake_engine, make_prompts) -> None:
    with fake_engine(malformed_every=3) as eng:
        records, _ = _run(eng, make_prompts(6), concurrency=2)
    failed = [r for r in records if not r.ok]
    assert len(failed) == 2
    assert all("malformed JSON chunk" in r.error for r in failed)
    assert all(r.ttft_s is not None for r in failed)  # the first token did arrive


def test_wrong_api_key_is_an_errored_record(fake_engine, make_prompts) -> None:
    with fake_engine() as eng:
        records, _ = _run(eng, make_prompts(2), concurrency=2, api_key="wrong")
    assert all(r.error and r.error.startswith("HTTP 401") for r in records)


def test_stalled_requests_time_out_per_request(fake_engine, make_prompts,
                                              virtual_clock) -> None:
    with fake_engine(stall_requests=True, virtual_clock=virtual_clock.path) as eng:
        records, wall_s = _run(eng, make_prompts(4), concurrency=4, request_timeout_s=0.5)
    assert len(records) == 4
    assert all(r.error and "timed out" in r.error for r in records)
    # All four in flight at once, each cut at its own 0.5 s: the level ends then.
    assert wall_s == pytest.approx(0.5, abs=1e-9)


def test_level_timeout_raises_measurement_failed(fake_engine, make_prompts) -> None:
    with fake_engine(stall_requests=True) as eng:
        with pytest.raises(MeasurementFailed, match="did not finish within 1 s"):
            _run(eng, make_prompts(3), concurrency=1, request_timeout_s=30.0,
                 level_timeout_s=0.6)


def test_server_dying_mid_stream_becomes_errored_records(fake_engine, make_prompts) -> None:
    with fake_engine(die_after_requests=2, tpot_ms=3) as eng:
        records, _ = _run(eng, make_prompts(5, output_len=20), concurrency=1)
        # Its sockets close a moment before it is reapable; a loaded host may take long.
        deadline = time.monotonic() + 60
        while eng.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not eng.alive()
    assert [r.ok for r in records[:2]] == [True, True]
    assert all(not r.ok for r in records[2:])
    # The dying request had its first token; the ones after it could not connect.
    assert records[2].ttft_s is not None
    assert all(r.ttft_s is None for r in records[3:])


# --- the closed loop spread over client processes ----------------------------------------------

def test_slots_shared_by_processes_stay_one_closed_loop(fake_engine, make_prompts,
                                                        fake_stats, virtual_clock) -> None:
    import multiprocessing

    done_order: list[int] = []
    with fake_engine(ttft_ms=100, tpot_ms=5, virtual_clock=virtual_clock.path) as eng:
        _reset(eng)
        # 5 slots over 2 processes (3 + 2): one shared queue of prompts, one clock.
        records, wall_s = _run(eng, make_prompts(17, output_len=8), concurrency=5,
                               processes=2, origin_s=0.0,
                               on_done=lambda r: done_order.append(r.index))
        stats = fake_stats(eng.url)
    assert stats["fake:max_inflight"] == 5 and stats["fake:requests_total"] == 17
    assert [r.index for r in records] == list(range(17)) and sorted(done_order) == list(range(17))
    assert all(r.ok and r.output_tokens == 8 and r.concurrency == 5 for r in records)
    # 17 requests of 135 ms, 5 at a time: 4 rounds, each started as the one before ended;
    # the clock is the caller's (origin 0: start_s are its readings).
    assert wall_s == pytest.approx(4 * 0.135, abs=1e-9)
    starts = sorted(r.start_s for r in records)
    t0 = starts[0]
    assert t0 > 0 and starts == pytest.approx(
        [t0 + 0.135 * (i // 5) for i in range(17)], abs=1e-6)
    assert all(r.ttft_s == pytest.approx(0.100, abs=1e-9) for r in records)
    assert multiprocessing.active_children() == []  # every client process reaped


def test_client_processes_grow_with_slots_and_stay_off_half_the_cores(monkeypatch) -> None:
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    assert [client_processes(c) for c in (1, 16, 17, 32, 64, 128, 512)] == \
        [1, 1, 2, 2, 4, 8, 8]
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    assert client_processes(128) == 1


def test_a_stalled_sharded_level_times_out_and_leaves_no_process(fake_engine, make_prompts):
    import multiprocessing

    with fake_engine(stall_requests=True) as eng:
        with pytest.raises(MeasurementFailed, match="did not finish within 1 s"):
            _run(eng, make_prompts(4), concurrency=4, processes=2, request_timeout_s=30.0,
                 level_timeout_s=1.0)
    assert multiprocessing.active_children() == []


def test_ctrl_c_during_a_sharded_level_interrupts_and_reaps(fake_engine, make_prompts):
    import multiprocessing
    import os
    import signal
    import threading

    # Stalled requests: only the Ctrl-C ends this level before its (far) timeout, so the
    # check needs no bound on how long the interrupt took, which a loaded host could break.
    with fake_engine(stall_requests=True) as eng:
        timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                _run(eng, make_prompts(8), concurrency=4, processes=2,
                     request_timeout_s=300.0, level_timeout_s=300.0)
        finally:
            timer.cancel()
    assert multiprocessing.active_children() == []
