"""A level measured in windows (tuner/measure/windows.py): the window size, when windows
agree, when a level stops, and how its windows become records; the settings and level fields
they add to tuner/records.py, and the flags that set them.
"""

from __future__ import annotations

import math

import pytest

from tuner.errors import ConfigError
from tuner.measure import windows
from tuner.measure.trial import _PromptPool
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records import LevelMetrics, MeasureSettings, Prompt, RequestRecord, SpecDecodeCounts

ON = MeasureSettings(concurrencies=(2,), stability_pct=5.0, stability_max_s=10.0)


def _window(tokens_per_s: float, *, n: int = 4, tpot_ms: float | None = None, first: int = 0,
            drafts: float = 0.0) -> windows.Window:
    """`n` requests of 11 tokens each over a wall that gives `tokens_per_s`, TPOT `tpot_ms`
    (default: as slow as the throughput, 10 ms at 1000 tok/s); prompts named by their number
    (`first` ...), counters drafts (before) to drafts + n."""
    wall_s = 11 * n / tokens_per_s
    tpot_ms = 10_000.0 / tokens_per_s if tpot_ms is None else tpot_ms
    records = tuple(RequestRecord(concurrency=2, index=i, warmup=False, start_s=0.1 * i,
                                  ttft_s=0.05, e2e_s=0.05 + 10 * tpot_ms / 1000.0,
                                  output_tokens=11, prompt_tokens=3) for i in range(n))
    prompts = tuple(Prompt(prompt=f"p{first + i}", prompt_len=3, output_len=11)
                    for i in range(n))
    return windows.Window(records=records, prompts=prompts, wall_s=wall_s,
                          before=SpecDecodeCounts(num_drafts=drafts),
                          after=SpecDecodeCounts(num_drafts=drafts + n))


# --- the window size ---------------------------------------------------------------------------
@pytest.mark.parametrize(("c", "num_prompts", "num_requests", "expected"), [
    (1, 16, None, 5),     # n = 16: 16 / 3 = 5.3, nearest whole round of 1
    (32, 16, None, 32),   # n = 4 x 32 = 128: 42.7, nearest whole round of 32
    (4, 16, None, 4),     # n = 16: 5.3, nearest round of 4
    (4, 32, None, 12),    # n = 32: 10.7, nearest round of 4
    (8, 1, 3, 8),         # --num-requests 3: never less than one round
    (3, 1, 9, 3),         # n = 9: exactly 3 windows of one round
])
def test_a_window_is_a_third_of_the_level_in_whole_rounds(c, num_prompts, num_requests,
                                                           expected):
    settings = MeasureSettings(concurrencies=(c,), num_requests=num_requests, stability_pct=3)
    size = settings.window_requests(c, num_prompts)
    assert size == expected and size % c == 0
    n = settings.requests_for(c, num_prompts)
    # settled at once: about today's requests, within one round per window either way
    assert abs(settings.stable_windows * size - n) <= settings.stable_windows * c / 2 or size == c


def test_a_short_window_makes_the_next_ones_last_min_window_s():
    s = MeasureSettings(concurrencies=(32,), stability_pct=3, min_window_s=2.0)
    assert windows.grown(32, 2.5, 32, s) == 32  # long enough: unchanged
    assert windows.grown(32, 0.5, 32, s) == 128  # 4x as long, whole rounds of 32
    assert windows.grown(32, 0.01, 32, s) == 256  # at most 8x at once
    assert windows.grown(6, 1.9, 4, s) == 8  # rounded up to whole rounds
    off = MeasureSettings(concurrencies=(32,), stability_pct=3, min_window_s=0.0)
    assert windows.grown(32, 0.01, 32, off) == 32


# --- when windows agree ------------------------------------------------------------------------
def test_the_spread_is_half_the_range_over_the_median():
    assert windows.spread_pct([100.0, 100.0, 100.0]) == 0.0
    assert windows.spread_pct([90.0, 100.0, 110.0]) == pytest.approx(10.0)
    assert windows.spread_pct([100.0, 104.0, 98.0]) == pytest.approx(3.0)
    assert windows.spread_pct([math.nan, math.nan]) == 0.0  # a figure no window has
    assert windows.spread_pct([math.nan, 100.0]) == math.inf  # cannot be judged
    assert windows.spread_pct([0.0, 0.0, 5.0]) == math.inf
    with pytest.raises(ValueError):
        windows.spread_pct([])


def test_windows_agree_when_their_per_token_latency_does():
    same = [_window(1000.0) for _ in range(3)]
    assert windows.stability_pct(same) == pytest.approx(0.0, abs=1e-9)
    slower_tokens = [_window(1000.0, tpot_ms=t) for t in (10.0, 10.0, 12.0)]
    assert windows.stability_pct(slower_tokens) == pytest.approx(10.0)
    # Another prompt mix (longer prefill) moves a window's throughput, not its TPOT: that is
    # the prompt sample's share of the spread, not an engine still settling.
    other_prompts = [_window(t, tpot_ms=10.0) for t in (800.0, 1000.0, 1000.0)]
    assert windows.stability_pct(other_prompts) == pytest.approx(0.0, abs=1e-9)
    assert windows.throughput_spread_pct(other_prompts) == pytest.approx(10.0)


def test_a_window_weighs_per_token_latency_by_tokens_so_one_short_stalled_request_is_noise():
    base = _window(1000.0, tpot_ms=10.0)  # 4 requests of 11 tokens, 10 ms a token
    # A fifth request of 2 tokens whose one gap held another request's 30 ms prefill: the
    # mean TPOT of the five goes from 10 to 14 ms (+40 %), their decode time per token to
    # 10.5 ms (+4.9 %).
    stalled = RequestRecord(concurrency=2, index=4, warmup=False, start_s=0.5, ttft_s=0.05,
                            e2e_s=0.08, output_tokens=2, prompt_tokens=3)
    one = windows.Window(records=base.records + (stalled,),
                         prompts=base.prompts + (Prompt(prompt="p4", prompt_len=3,
                                                        output_len=2),),
                         wall_s=base.wall_s, before=base.before, after=base.after)
    assert base.decode_ms_per_token == pytest.approx(10.0)
    assert one.decode_ms_per_token == pytest.approx((400.0 + 30.0) / 41)
    failed = RequestRecord(concurrency=2, index=0, warmup=False, start_s=0.0, error="boom")
    empty = windows.Window(records=(failed,), prompts=base.prompts[:1], wall_s=1.0,
                           before=base.before, after=base.after)
    assert math.isnan(empty.decode_ms_per_token)


def test_a_level_stops_once_its_last_windows_agree_or_its_time_is_up():
    settling = [_window(500.0), _window(800.0), _window(1000.0), _window(1010.0),
                _window(1000.0)]
    # Never before 3 windows, even past the time cap.
    assert not windows.finished(settling[:2], ON, elapsed_s=99.0)
    assert not windows.finished([], ON, elapsed_s=99.0)
    assert not windows.finished(settling[:3], ON, elapsed_s=1.0)  # 500, 800, 1000 disagree
    assert not windows.finished(settling[:4], ON, elapsed_s=1.0)  # 800 still settling
    assert windows.finished(settling, ON, elapsed_s=1.0)  # 1000, 1010, 1000: ±0.5 %
    assert windows.finished(settling[:3], ON, elapsed_s=10.0)  # the cap, unsettled
    tight = ON.model_copy(update={"stability_pct": 0.1})
    assert not windows.finished(settling, tight, elapsed_s=9.9)


# --- windows become the level's records --------------------------------------------------------
def test_settling_windows_become_warm_up_and_the_stable_ones_the_level():
    ws = [_window(500.0 + 100 * k, first=4 * k, drafts=4.0 * k) for k in range(2)]
    ws += [_window(1000.0, first=8 + 4 * k, drafts=8.0 + 4 * k) for k in range(3)]
    out = windows.split(ws, ON, warmups=2, measure_s=7.5)
    # Settling: warm-up, numbered after the 2 short warm-ups, in send order; prompts[i] is
    # what index i (minus the short warm-ups) sent.
    assert [(r.index, r.warmup) for r in out.settling] == [(2 + i, True) for i in range(8)]
    assert [p.prompt for p in out.settling_prompts] == [f"p{i}" for i in range(8)]
    # Stable: the level's requests, numbered from 0 in send order.
    assert [(r.index, r.warmup) for r in out.records] == [(i, False) for i in range(12)]
    assert [p.prompt for p in out.prompts] == [f"p{8 + i}" for i in range(12)]
    assert [r.start_s for r in out.records[:4]] == [r.start_s for r in ws[2].records]
    assert out.counts.num_drafts == 12.0  # /metrics over the stable windows alone
    assert out.wall_s == pytest.approx(3 * 44 / 1000.0)
    f = out.fields
    assert f["windows"] == pytest.approx((500.0, 600.0, 1000.0, 1000.0, 1000.0))
    assert f["window_tpot_ms"] == pytest.approx(tuple(10_000.0 / t for t in f["windows"]))
    assert f["stable_windows"] == 3 and f["converged"] is True and f["measure_s"] == 7.5
    assert f["stability_pct"] == pytest.approx(0.0, abs=1e-9)


def test_a_level_that_never_settled_is_measured_on_its_last_windows():
    ws = [_window(100.0 * (k + 1), first=4 * k) for k in range(4)]
    out = windows.split(ws, ON, warmups=0, measure_s=10.2)
    assert len(out.settling) == 4 and len(out.records) == 12
    assert out.fields["converged"] is False
    # TPOT 50, 33.3, 25 ms over the last three: half the range over the median
    assert out.fields["stability_pct"] == pytest.approx(100 * 12.5 / (100 / 3))
    assert [r.index for r in out.settling] == [0, 1, 2, 3]


def test_a_level_whose_windows_failed_cannot_be_judged():
    broken = [windows.Window(records=(RequestRecord(concurrency=1, index=0, warmup=False,
                                                    start_s=0.0, error="HTTP 500"),),
                             prompts=(Prompt(prompt="p", prompt_len=1, output_len=4),),
                             wall_s=0.1, before=SpecDecodeCounts(), after=SpecDecodeCounts())
              for _ in range(2)] + [_window(100.0)]
    out = windows.split(broken, ON, warmups=0, measure_s=1.0)
    assert out.fields["stability_pct"] is None and out.fields["converged"] is False


# --- the records -------------------------------------------------------------------------------
def _level(**update) -> LevelMetrics:
    from tuner.measure import metrics

    base = metrics.level_metrics([], concurrency=8, duration_s=1.0, warmup_requests=0,
                                 counts=SpecDecodeCounts())
    return base.model_copy(update=update)


def test_levels_and_settings_stored_before_windows_load_as_measured_without_them():
    old = _level().model_dump(by_alias=True)
    for key in ("windows", "window_tpot_ms", "stable_windows", "stability_pct", "converged",
                "measure_s"):
        del old[key]
    level = LevelMetrics.model_validate(old)
    assert level.converged is None and level.windows == () and level.windows_text() == ""
    settings = MeasureSettings.model_validate({"concurrencies": [1], "num_requests": 4})
    assert settings.stability_pct == 0.0 and settings.stable_windows == 3
    again = MeasureSettings.model_validate(ON.model_dump(mode="json"))
    assert again == ON


def test_how_the_windows_are_said():
    done = _level(windows=(800.0, 812.0, 810.0), stable_windows=3, stability_pct=1.23,
                  converged=True, measure_s=14.2)
    assert done.windows_text() == "3 windows, ±1.2%, 14 s"
    assert LevelMetrics.stability_text(True, 1.23) == "±1.2%"
    late = _level(windows=(1.0,) * 9, stable_windows=3, stability_pct=6.06, converged=False,
                  measure_s=60.4)
    assert late.windows_text() == "not converged: ±6.1% after 60 s, 9 windows"
    assert LevelMetrics.stability_text(False, 6.06) == "not converged ±6.1%"
    assert LevelMetrics.stability_text(False, None) == "not converged ±?"
    assert LevelMetrics.stability_text(None, None) == ""


# --- the flags ---------------------------------------------------------------------------------
def _bench_settings(monkeypatch, tmp_path, *argv: str) -> MeasureSettings:
    from tuner import api, cli

    seen = []
    monkeypatch.setattr(api, "bench", lambda options, **_kw: seen.append(options) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["bench", "--model", str(EMBEDDED_TOKENIZER), "--output-dir",
                  str(tmp_path / "b"), *argv])
    return seen[0].settings


def test_the_flags_reach_the_settings(monkeypatch, tmp_path):
    default = _bench_settings(monkeypatch, tmp_path)
    assert (default.stability_pct, default.stability_max_s) == (3.0, 60.0)
    off = _bench_settings(monkeypatch, tmp_path, "--stability", "0", "--stability-max-s", "5")
    assert (off.stability_pct, off.stability_max_s) == (0.0, 5.0)


def test_the_flags_for_optimize_too(monkeypatch, tmp_path):
    from tuner import api, cli

    seen = []
    monkeypatch.setattr(api, "optimize_and_report",
                        lambda options, **_kw: seen.append(options) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["optimize", "--model", str(EMBEDDED_TOKENIZER), "--output-dir",
                  str(tmp_path / "o"), "--stability", "2.5", "--stability-max-s", "120"])
    assert (seen[0].settings.stability_pct, seen[0].settings.stability_max_s) == (2.5, 120.0)


@pytest.mark.parametrize(("argv", "says"), [
    (["--stability", "51"], "--stability 51: must be a finite number of percent between 0 and "
                            "50"),
    (["--stability", "-1"], "--stability -1: must be"),
    (["--stability", "nan"], "--stability nan: must be"),
    (["--stability-max-s", "0"], "--stability-max-s 0: must be a finite number of seconds "
                                 "between 0.1 and 86400"),
])
def test_a_bad_value_is_one_line_and_exit_2(capsys, tmp_path, argv, says):
    from tuner import cli

    rc = cli.main(["bench", "--model", str(EMBEDDED_TOKENIZER), "--output-dir",
                   str(tmp_path / "b"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_the_check_refuses_outside_the_bounds():
    from tuner import checks

    assert checks.check("stability", "0") == 0.0 and checks.check("stability", "50") == 50.0
    with pytest.raises(ConfigError, match="Example: --stability 3"):
        checks.check("stability", "50.5")


# --- where it is shown -------------------------------------------------------------------------
def test_bench_table_and_report_say_whether_each_level_converged():
    import pandas as pd

    from tuner.outputs import console, report
    from tuner.records import BenchResult, EngineInfo, TrialConfig

    done = _level(converged=True, stability_pct=1.23, windows=(1.0,) * 3, stable_windows=3)
    late = _level(converged=False, stability_pct=6.06, windows=(1.0,) * 9, stable_windows=3)
    result = BenchResult(config=TrialConfig(), engine=EngineInfo(start_s=1.0),
                         levels=(done, late.model_copy(update={"concurrency": 16})))
    lines = console.bench_table(result).splitlines()
    assert lines[1].endswith("windows")
    assert lines[3].endswith(" ±1.2%") and lines[4].endswith(" not converged ±6.1%")
    one_block = BenchResult(config=TrialConfig(), engine=EngineInfo(start_s=1.0),
                            levels=(_level(),))
    assert "windows" not in console.bench_table(one_block)
    # A trial's level in the report: after its throughput; nothing for one stored without.
    assert report._steadiness(pd.Series({"converged": True, "stability_pct": 1.23})) == \
        " (±1.2%)"
    assert report._steadiness(pd.Series({"converged": False, "stability_pct": 6.06})) == \
        " (not converged ±6.1%)"
    assert report._steadiness(pd.Series({"converged": None, "stability_pct": math.nan})) == ""
    assert report._steadiness(pd.Series({"output_throughput": 1.0})) == ""


def test_the_pool_salts_each_pass_after_the_first_so_the_prefix_cache_cannot_serve_it() -> None:
    prompts = tuple(Prompt(prompt=f"q{i}", prompt_len=1, output_len=4) for i in range(3))
    pool = _PromptPool(prompts)
    first, reused = pool.take(2)
    assert reused == 0 and [p.cache_salt for p in first] == [None, None]
    wrapped, reused = pool.take(5)  # q2, then q0 q1 q2 again, then q0 a third time
    assert reused == 4
    assert [p.prompt for p in wrapped] == ["q2", "q0", "q1", "q2", "q0"]
    assert [p.cache_salt for p in wrapped] == [None, "spec-tuner-pass-1", "spec-tuner-pass-1",
                                               "spec-tuner-pass-1", "spec-tuner-pass-2"]
    assert wrapped[1].model_copy(update={"cache_salt": None}) == prompts[0]  # text unchanged
