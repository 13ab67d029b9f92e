"""benchmarks/noise_sources.py: its plan (which measurements, which prompts) and the
statistics and tables of `analyze`, on made-up figures."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from conftest import load_benchmark

from tuner.errors import ConfigError

ns = load_benchmark("noise_sources")


def _plan(suspects: str, levels=(1, 8), reps: int = 3):
    return ns.plan_steps(levels, suspects, reps=reps, requests_of=lambda c: max(4, 2 * c),
                         warmups_of=lambda c: c)


# --- the plan --------------------------------------------------------------------------------
def test_plan_runs_every_suspect_in_order_and_the_long_one_at_the_top_level_only():
    steps = _plan("abcdef")
    assert [s.key for s in steps] == [
        "c1/nowarm", "c1/rep0", "c1/rep1", "c1/rep2", "c1/again", "c1/sample", "c1/converge",
        "c8/nowarm", "c8/rep0", "c8/rep1", "c8/rep2", "c8/again", "c8/sample", "c8/converge",
        "c8/long"]
    by = {s.key: s for s in steps}
    assert by["c1/nowarm"].warmups == 0 and by["c8/rep0"].warmups == 8
    assert by["c8/long"].requests == ns.LONG * 16
    assert by["c8/again"].prompts_like == "rep2"
    assert by["c1/converge"].converging and by["c1/converge"].pool == 1 + ns.LONG * 4


def test_without_the_repeats_one_still_runs_as_the_reference():
    assert [s.name for s in _plan("d", levels=(4,))] == ["rep0", "again"]
    assert [s.name for s in _plan("a", levels=(4,), reps=2)] == ["rep0", "rep1"]


def test_prompts_are_fresh_until_the_data_runs_out_and_again_sends_the_same():
    steps = _plan("acd", levels=(1,), reps=2)  # rep0, rep1, again, sample; 1 warm-up + 4 each
    main = [f"m{i}" for i in range(8)]
    got = ns.allocate(steps, main, ["o0", "o1", "m0", "o3", "o4"])
    assert got["c1/rep0"].indices == (0, 1, 2, 3, 4) and got["c1/rep0"].seen_before == 0
    assert got["c1/rep1"].indices == (5, 6, 7, 0, 1)  # wraps round: m0 and m1 sent before
    assert got["c1/rep1"].seen_before == 2
    assert got["c1/again"].indices == got["c1/rep1"].indices
    assert got["c1/again"].seen_before == 5
    assert got["c1/sample"].source == "other" and got["c1/sample"].seen_before == 1  # m0


def test_a_step_larger_than_the_data_counts_its_own_repeats():
    got = ns.allocate(_plan("a", levels=(1,), reps=1), ["x", "y"], [])
    assert got["c1/rep0"].indices == (0, 1, 0, 1, 0) and got["c1/rep0"].seen_before == 3


def test_interleaved_launches_alternate_and_know_what_came_before():
    plain = ns.launch_sequence(3, interleave=False)
    assert [(x.role, x.predecessor) for x in plain] == [
        ("main", "none"), ("main", "main"), ("main", "main")]
    mixed = ns.launch_sequence(3, interleave=True)
    assert [x.folder for x in mixed] == ["launch-01-main", "launch-02-between", "launch-03-main",
                                         "launch-04-between", "launch-05-main"]
    assert [x.predecessor for x in mixed] == ["none", "main", "between", "main", "between"]


def test_suspects_option_reads_letters_and_refuses_others_with_the_list():
    assert ns.suspects_option("f, a,B") == "abf"
    with pytest.raises(ConfigError, match=r"unknown x.*a repeats within a launch.*--interleave"):
        ns.suspects_option("a,x")
    with pytest.raises(ConfigError, match="unknown i"):
        ns.suspects_option("i")


# --- statistics -------------------------------------------------------------------------------

def test_components_split_a_table_of_launch_and_prompt_effects():
    launch = [0.0, 10.0]  # launch 1 runs 10 tok/s faster throughout
    prompts = [-3.0, 3.0, 0.0]  # the repeats' prompt sets, the same in every launch
    table = [[100.0 + a + b for b in prompts] for a in launch]
    comp = ns.components(table)
    assert comp.mean == pytest.approx(105.0)
    assert comp.timing_pct == pytest.approx(0.0, abs=1e-9)
    assert comp.prompts_pct == pytest.approx(100 * statistics.stdev(prompts) / 105.0)
    assert comp.launch_pct == pytest.approx(100 * statistics.stdev([100.0, 110.0]) / 105.0)
    # Within a launch a user sees the prompt sets' differences only.
    assert comp.within_pct == pytest.approx(100 * statistics.stdev(prompts) / 105.0)


def test_components_take_timing_noise_out_of_the_launch_means():
    table = [[100.0, 104.0], [104.0, 100.0]]  # no launch or prompt effect, only noise
    comp = ns.components(table)
    assert comp.launch_means_pct == pytest.approx(0.0)
    assert comp.timing_pct > 0 and comp.launch_pct == pytest.approx(0.0)
    single = ns.components([[100.0, 110.0]])
    assert single.launch_pct is None and single.timing_pct is None
    assert single.within_pct == pytest.approx(100 * statistics.stdev([100, 110]) / 105.0)
    assert ns.components([[100.0], [110.0]]).within_pct is None
    with pytest.raises(ValueError):
        ns.components([[1.0, 2.0], [3.0]])


def test_half_range_and_effects():
    assert ns.half_range_pct([90.0, 100.0, 110.0]) == pytest.approx(10.0)
    assert ns.half_range_pct([100.0]) is None
    eff = ns.paired_effect({1: 95.0, 2: 99.0, 3: 50.0}, {1: 100.0, 2: 100.0})
    assert (eff.pct, eff.n) == (pytest.approx(-3.0), 2)
    assert eff.spread == pytest.approx(statistics.stdev([-5.0, -1.0]))
    assert eff.exceeds(2.0) == "yes" and eff.exceeds(4.0) == "no" and eff.exceeds(None) == "?"
    assert ns.paired_effect({1: 1.0}, {2: 1.0}) is None


def test_a_split_effect_compares_the_busy_half_with_the_quiet_half():
    points = [(0.1, 1.0), (0.2, 0.0), (0.9, -4.0), (1.0, -6.0)]
    eff = ns.split_effect(points)
    assert eff.pct == pytest.approx(-5.5) and eff.n == 4
    assert eff.spread == pytest.approx(math.sqrt(0.5 / 2 + 2.0 / 2))
    assert ns.split_effect(points[:3]) is None


def test_the_order_effect_needs_launches_on_both_sides():
    means = {1: 100.0, 3: 95.0, 5: 96.0}
    eff = ns.order_effect(means, {1: "none", 3: "between", 5: "between"})
    assert eff.pct == pytest.approx(100 * (95.5 / 96.0 - 1) - 100 * (100 / 96.0 - 1))
    assert ns.order_effect(means, {1: "none", 3: "main", 5: "main"}) is None


# --- the tables -------------------------------------------------------------------------------
def _doc(launch: int, name: str, tput: float, **more):
    suspect = {"rep": "a", "converge": "b", "again": "d"}[name.rstrip("0123456789")]
    return {"launch": launch, "role": "main", "predecessor": "none", "level": 4, "name": name,
            "suspect": suspect, "output_throughput": tput, "window_s": 2.0,
            "client_cores": 0.1 * launch, "monitor": {"others_cores": 0.0, "others_top": [],
                                                      "loadavg_max": 1.0},
            "converged": more.get("converged"), "windows": more.get("windows", []),
            "prompts_sent": 5, "prompts_seen_before": 1}


def test_level_report_shows_components_effects_and_the_launch_spreads():
    docs = []
    for launch, base in ((1, 100.0), (2, 110.0)):
        docs += [_doc(launch, "rep0", base - 2), _doc(launch, "rep1", base + 2),
                 _doc(launch, "again", base + 4),
                 _doc(launch, "converge", base, converged=launch == 1, windows=[1, 2, 3])]
    data = ns.LevelData.of(docs, 4)
    assert data.reps == ["rep0", "rep1"] and data.rep_means() == {1: 100.0, 2: 110.0}
    rows = {label: values for label, values, _, _ in ns.spread_rows(data)}
    assert rows["old way, one block"] == [98.0, 108.0]
    assert "old way, 4x requests" not in rows
    effects = dict(ns.level_effects(data))
    assert effects["d"].pct == pytest.approx(100 * statistics.fmean([104 / 102 - 1, 114 / 112 - 1]))
    assert effects["c"] is None and effects["b"].pct == pytest.approx(0.0)
    text = "\n".join(ns.level_report(docs, 4))
    assert "c=4: 2 launches x 2 repeats, mean 105.0 tok/s" in text
    assert "1/2 converged, 3 windows" in text
    assert "(d) same prompts again (prefix cache warm)" in text
    assert "(c) other prompt sample" not in text  # not measured, not shown


def test_measurements_without_the_engine_fields_still_make_their_tables(capsys):
    docs = [_doc(1, "rep0", 100.0), _doc(1, "rep1", 101.0), _doc(2, "rep0", 99.0),
            _doc(2, "rep1", 103.0)]
    text = "\n".join(ns.level_report(docs, 4))
    assert "c=4: 2 launches x 2 repeats" in text
    assert text.endswith("engine processes and GPU: not recorded in these measurements")
    stored = Path(__file__).parents[2] / "benchmarks/data/h100/noise-16p-3launches"
    ns.analyze(stored)
    out = capsys.readouterr().out
    assert "c=32: 3 launches x 2 repeats, mean 8759.7 tok/s" in out
    assert out.count("not recorded in these measurements") == 3


def test_machine_lines_tell_the_share_of_prompts_sent_twice():
    docs = [_doc(1, "rep0", 100.0), _doc(1, "rep1", 101.0)]
    lines = ns.machine_lines(docs, [4])
    assert "prompts sent before in the launch 20%" in lines[0]
    assert lines[-1].startswith("load average up to 1.0")


def test_stability_settings_turn_the_windows_off_for_the_old_way():
    if "stability_pct" not in ns.MeasureSettings.model_fields:
        with pytest.raises(ConfigError, match="no --stability"):
            ns.stability_settings(converging=True, pct=3.0, max_s=None)
        return
    assert ns.stability_settings(converging=False, pct=3.0, max_s=20.0) == {"stability_pct": 0.0}
    assert ns.stability_settings(converging=True, pct=3.0, max_s=20.0) == {
        "stability_pct": 3.0, "stability_max_s": 20.0}
