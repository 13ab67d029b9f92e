"""A level's measured requests as fixed windows (tuner/measure/windows.py): how they are cut,
when they agree, how steady a level is said to be; the settings and level fields they add to
tuner/records/configs.py, and the flags that set them. Windows never change what a level sends
(tuner.measure.request_schedule fixes that before the first launch).
"""

from __future__ import annotations

import math

import pytest

from tuner.errors import ConfigError
from tuner.measure import windows
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings
from tuner.records.results import LevelMetrics, RequestRecord, SpecDecodeCounts

ON = MeasureSettings(concurrencies=(2,), stability_pct=5.0)


def _records(n: int, *, tpot_ms: float = 10.0, first: int = 0, start: float = 0.0,
             tokens: int = 11) -> list[RequestRecord]:
    """`n` requests of `tokens` tokens one after another (c=1), TPOT `tpot_ms`."""
    out, t = [], start
    for i in range(n):
        e2e = 0.05 + (tokens - 1) * tpot_ms / 1000.0
        out.append(RequestRecord(concurrency=1, index=first + i, warmup=False, start_s=t,
                                 ttft_s=0.05, e2e_s=e2e, output_tokens=tokens, prompt_tokens=3))
        t += e2e
    return out


# --- the windows are fixed slices of the measured requests -------------------------------------
@pytest.mark.parametrize(("n", "windows_", "sizes"), [
    (9, 3, [3, 3, 3]), (10, 3, [4, 3, 3]), (11, 3, [4, 4, 3]), (2, 3, [1, 1]), (1, 3, [1]),
])
def test_the_measured_requests_are_cut_in_send_order_into_near_equal_slices(n, windows_, sizes):
    records = _records(n)
    shuffled = records[::-2] + records[-2::-2]  # completion order is not send order
    cut = windows.slices(shuffled, windows_)
    assert [len(w.records) for w in cut] == sizes
    assert [r.index for w in cut for r in w.records] == list(range(n))


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
    same = windows.slices(_records(9), 3)
    assert windows.stability_pct(same) == pytest.approx(0.0, abs=1e-9)
    slower = windows.slices(_records(6) + _records(3, tpot_ms=12.0, first=6, start=10.0), 3)
    assert windows.stability_pct(slower) == pytest.approx(100 * 1.0 / 10.0, rel=1e-6)
    # A window of longer answers moves its throughput a little (less TTFT per token), its
    # decode time per token not at all.
    longer = windows.slices(_records(6) + _records(3, first=6, start=10.0, tokens=41), 3)
    assert windows.stability_pct(longer) == pytest.approx(0.0, abs=1e-9)
    assert windows.throughput_spread_pct(longer) > 0.1


def test_a_window_weighs_per_token_latency_by_tokens_so_one_short_stalled_request_is_noise():
    base = _records(4)  # 4 requests of 11 tokens, 10 ms a token
    # A fifth request of 2 tokens whose one gap held another request's 30 ms prefill: the
    # mean TPOT of the five goes from 10 to 14 ms (+40 %), their decode time per token to
    # 10.5 ms (+4.9 %).
    stalled = RequestRecord(concurrency=1, index=4, warmup=False, start_s=0.5, ttft_s=0.05,
                            e2e_s=0.08, output_tokens=2, prompt_tokens=3)
    assert windows.Window(tuple(base)).decode_ms_per_token == pytest.approx(10.0)
    assert windows.Window(tuple(base) + (stalled,)).decode_ms_per_token == \
        pytest.approx((400.0 + 30.0) / 41)
    failed = RequestRecord(concurrency=1, index=0, warmup=False, start_s=0.0, error="boom")
    assert math.isnan(windows.Window((failed,)).decode_ms_per_token)
    assert math.isnan(windows.Window((failed,)).output_throughput)


def test_a_level_is_steady_when_its_windows_agree_within_the_target():
    steady = windows.fields(_records(9), ON)
    assert steady.converged is True and steady.stable_windows == 3
    assert len(steady.windows) == len(steady.window_tpot_ms) == 3
    assert steady.window_tpot_ms == pytest.approx((10.0, 10.0, 10.0))
    drifting = windows.fields(_records(6) + _records(3, tpot_ms=12.0, first=6, start=10.0), ON)
    assert drifting.converged is False and drifting.stability_pct == pytest.approx(10.0)
    # Fewer requests than windows: as many windows as requests, never steady by default.
    short = windows.fields(_records(2), ON)
    assert short.stable_windows == 2 and short.converged is False
    assert windows.fields(_records(9), ON.model_copy(update={"stability_pct": 0.0})) is None
    assert windows.fields([], ON) is None


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
    # Settings stored before windows read with today's defaults: windows only report, so a
    # level measured then and one measured now sent the same kind of block.
    settings = MeasureSettings.model_validate({"concurrencies": [1], "num_requests": 4})
    assert settings == MeasureSettings(concurrencies=(1,), num_requests=4)
    again = MeasureSettings.model_validate(ON.model_dump(mode="json"))
    assert again == ON
    # Settings stored while windows drew new prompts until they agreed: their time cap and
    # minimum window time are dropped, the rest reads as it was.
    retired = MeasureSettings.model_validate({"concurrencies": [1], "stability_pct": 3.0,
                                              "stability_max_s": 60.0, "min_window_s": 2.0})
    assert retired == MeasureSettings(concurrencies=(1,), stability_pct=3.0)


def test_how_the_windows_are_said():
    done = _level(windows=(800.0, 812.0, 810.0), stable_windows=3, stability_pct=1.23,
                  converged=True, measure_s=14.2)
    assert done.windows_text() == "3 windows ±1.2%"
    assert LevelMetrics.stability_text(True, 1.23) == "±1.2%"
    late = _level(windows=(1.0,) * 3, stable_windows=3, stability_pct=6.06, converged=False,
                  measure_s=60.4)
    assert late.windows_text() == "unsteady: 3 windows ±6.1%"
    assert LevelMetrics.stability_text(False, 6.06) == "unsteady ±6.1%"
    assert LevelMetrics.stability_text(False, None) == "unsteady ±?"
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
    assert (default.stability_pct, default.allow_repeats) == (3.0, False)
    off = _bench_settings(monkeypatch, tmp_path, "--stability", "0", "--allow-repeats")
    assert (off.stability_pct, off.allow_repeats) == (0.0, True)


def test_the_retired_time_cap_is_ignored_with_one_warning(monkeypatch, tmp_path, capsys):
    settings = _bench_settings(monkeypatch, tmp_path, "--stability-max-s", "40")
    assert settings == _bench_settings(monkeypatch, tmp_path)
    err = capsys.readouterr().err
    assert "tuner: warning: --stability-max-s 40 is ignored: a level no longer runs until its " \
           "windows agree" in err


def test_the_flags_for_optimize_too(monkeypatch, tmp_path):
    from tuner import api, cli

    seen = []
    monkeypatch.setattr(api, "optimize_and_report",
                        lambda options, **_kw: seen.append(options) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["optimize", "--model", str(EMBEDDED_TOKENIZER), "--output-dir",
                  str(tmp_path / "o"), "--stability", "2.5", "--allow-repeats"])
    assert (seen[0].settings.stability_pct, seen[0].settings.allow_repeats) == (2.5, True)


@pytest.mark.parametrize(("argv", "says"), [
    (["--stability", "51"], "--stability 51: must be a finite number of percent between 0 and "
                            "50"),
    (["--stability", "-1"], "--stability -1: must be"),
    (["--stability", "nan"], "--stability nan: must be"),
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

    from tuner.outputs import console, report_content
    from tuner.records.configs import TrialConfig
    from tuner.records.results import BenchResult, EngineInfo

    done = _level(converged=True, stability_pct=1.23, windows=(1.0,) * 3, stable_windows=3)
    late = _level(converged=False, stability_pct=6.06, windows=(1.0,) * 3, stable_windows=3)
    result = BenchResult(config=TrialConfig(), engine=EngineInfo(start_s=1.0),
                         levels=(done, late.model_copy(update={"concurrency": 16})))
    lines = console.bench_table(result).splitlines()
    assert lines[1].endswith("windows")
    assert lines[3].endswith(" ±1.2%") and lines[4].endswith(" unsteady ±6.1%")
    one_block = BenchResult(config=TrialConfig(), engine=EngineInfo(start_s=1.0),
                            levels=(_level(),))
    assert "windows" not in console.bench_table(one_block)
    # A trial's level in the report: after its throughput; nothing for one stored without.
    assert report_content._steadiness(pd.Series({"converged": True, "stability_pct": 1.23})) == \
        " (±1.2%)"
    assert report_content._steadiness(pd.Series({"converged": False, "stability_pct": 6.06})) == \
        " (unsteady ±6.1%)"
    assert report_content._steadiness(pd.Series({"converged": None, "stability_pct": math.nan})) == ""
    assert report_content._steadiness(pd.Series({"output_throughput": 1.0})) == ""
