"""benchmarks/sampled_acceptance.py: its configs and cases, and the coverage and tables of
`analyze`, on made-up rows."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

from tuner.errors import ConfigError

sa = load_benchmark("sampled_acceptance")


def _row(config: str, rep: int, pred, pm, measured, *, temperature: float = 0.8):
    return {"temperature": temperature, "workload": "sharegpt", "concurrency": 1, "rep": rep,
            "config": config, "pred": pred, "pm": pm, "measured": measured,
            "own_replay": measured, "benches_before": rep}


def test_the_baseline_and_six_ngram_configs_and_suffix_only_where_it_imports():
    plain = sa.all_configs(suffix=False)
    assert list(plain)[0] == sa.BASE and plain[sa.BASE] is None
    assert len([n for n in plain if n.startswith("ngram")]) == 6
    assert plain["ngram-k8-w2-5"] == {"method": "ngram", "num_speculative_tokens": 8,
                                      "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert "suffix-k8" in sa.all_configs(suffix=True) and "suffix-k8" not in plain


def test_picked_configs_keep_the_baseline_first_and_refuse_unknown_names():
    assert list(sa.pick_configs("ngram-k4-w1-3", suffix=False)) == [sa.BASE, "ngram-k4-w1-3"]
    assert list(sa.pick_configs(None, suffix=False)) == list(sa.all_configs(suffix=False))
    with pytest.raises(ConfigError, match="unknown ngram-k3.*Valid: base, ngram-k2-w1-3"):
        sa.pick_configs("ngram-k3", suffix=False)
    with pytest.raises(ConfigError, match="suffix needs arctic_inference"):
        sa.pick_configs("suffix-k8", suffix=False)


def test_cases_run_repeat_by_repeat_and_name_their_folders():
    cases = sa.plan_cases([0.8, 1.0], ["instructcoder"], [1, 8], reps=2)
    assert len(cases) == 8 and {c.rep for c in cases[:4]} == {0}
    assert cases[0].name == "t0.8-instructcoder-c1-r0" and cases[-1].name == "t1-instructcoder-c8-r1"


def test_gpu_share_flags_are_added_where_the_user_set_none():
    assert sa.share_args(()) == ("--kv-cache-memory-bytes", "2G", "--gpu-memory-utilization",
                                 "0.08", "--max-num-seqs", "64")
    assert sa.share_args(("--max-num-seqs=32", "--gpu-memory-utilization", "0.2")) == (
        "--kv-cache-memory-bytes", "2G")


def test_covered_means_within_the_half_width():
    assert sa.covered(2.0, 0.1, 2.09) is True and sa.covered(2.0, 0.1, 1.91) is True
    assert sa.covered(2.0, 0.1, 2.11) is False
    assert sa.covered(2.0, None, 2.0) is None and sa.covered(None, 0.1, 2.0) is None
    assert sa.covered(2.0, float("nan"), 2.0) is None


def test_errors_spread_and_coverage_over_rows():
    rows = sa.with_errors([_row("k4", 0, 2.0, 0.2, 2.1), _row("k4", 1, 2.1, 0.2, 1.7),
                           _row("k8", 0, 3.0, 0.3, None),
                           _row("k4", 0, 2.5, None, 2.5, temperature=0.0)])
    k4 = [r for r in rows if r["config"] == "k4" and r["temperature"] > 0]
    assert [r["covered"] for r in k4] == [True, False]
    assert k4[0]["err_pct"] == pytest.approx(100 * (2.0 - 2.1) / 2.1)
    assert k4[0]["spread"] == pytest.approx(0.2)  # half of 2.1 - 1.7
    assert rows[2]["err_pct"] is None and rows[2]["covered"] is None
    assert sa.coverage(rows, sampled=True) == (1, 2)
    assert sa.coverage(rows, sampled=False) == (0, 0)  # no interval at temperature 0


def test_case_tables_put_the_repeats_of_a_config_under_each_other():
    rows = sa.with_errors([_row("ngram-k4-w1-3", 0, 2.0, 0.2, 2.1),
                           _row("ngram-k4-w1-3", 1, 2.1, 0.2, 1.7)])
    lines = sa.case_tables(rows)
    assert lines[1].startswith("T=0.8 sharegpt c=1 (2 repeats")
    first, second = lines[3], lines[4]
    assert first.split()[:5] == ["ngram-k4-w1-3", "2.000", "±0.200", "2.100", "-4.8"]
    assert first.split()[5:] == ["yes", "2.100", "0.200"]
    assert second.split() == ["2.100", "±0.200", "1.700", "+23.5", "NO", "1.700"]


def test_temperatures_are_checked():
    assert sa._floats("0.8, 1") == [0.8, 1.0]
    for bad in ("hot", "3", ""):
        with pytest.raises(ConfigError, match="from 0 to 2"):
            sa._floats(bad)
