"""benchmarks/noise_covariates.py: rank correlation with its permutation test, and the engine
and GPU block of `analyze`, on made-up measurements."""

from __future__ import annotations

import re

import pytest
from conftest import load_benchmark

cov = load_benchmark("noise_covariates")


def test_ranks_spearman_and_a_permutation_p():
    assert cov.ranks([10.0, 30.0, 20.0, 20.0]) == [1.0, 4.0, 2.5, 2.5]
    assert cov.spearman([1, 2, 3, 4, 5], [10, 20, 30, 40, 100]) == pytest.approx(1.0)
    assert cov.spearman([1, 2, 3], [5, 5, 5]) is None
    # n = 4, a perfect rank order: 2 of the 24 orders are as extreme.
    assert cov.permutation_p([1, 2, 3, 4], [1, 2, 3, 4]) == pytest.approx(2 / 24, abs=0.02)
    assert cov.permutation_p(range(10), range(10)) < 0.001
    # Five measurements: the two fastest against the two slowest, the middle one in neither.
    rel = cov.relate([(100.0, 3.0), (90.0, 2.0), (110.0, 5.0), (80.0, 1.0), (95.0, 9.0)])
    assert rel.n == 5 and rel.top == pytest.approx(4.0) and rel.bottom == pytest.approx(1.5)
    assert rel.rho == pytest.approx(1 - 6 * 6 / 120)  # rank differences 0, 0, 2, -1, -1
    few = cov.relate([(1.0, 2.0), (2.0, 3.0), (3.0, 1.0)])
    assert few.rho is None and few.p is None and (few.top, few.bottom) == (1.0, 2.0)
    assert cov.relate([(1.0, 2.0)]) is None


def _engine_doc(launch: int, tput: float, *, cpu: int, sm: float):
    """A main launch's measurement at c=4 with the engine's and the GPU's fields: the
    EngineCore's main thread busy at 0.95 of a core on `cpu`, the GPU's SM clock at `sm`."""
    core = {"pid": 13, "label": "VLLM::EngineCore", "samples": 5, "cores": 1.1,
            "main_cores": 0.95, "main_wait_share": 0.01, "cpus": {str(cpu): 5},
            "cpu_changes_per_s": 0.0, "migrations_per_s": 0.5, "involuntary_per_s": 3.0,
            "allowed": "0-31", "threads": 40}
    api = {**core, "pid": 12, "label": "api_server", "cores": 0.3, "main_cores": 0.25}
    return {"launch": launch, "role": "main", "level": 4, "output_throughput": tput,
            "monitor": {"engine": [core, api], "gpu": {
                "probe": "nvidia-smi", "local_cpus": "0-15", "numa_node": 0,
                "sm_mhz_mean": sm, "power_w_mean": 70.0}}}


def test_the_engine_block_relates_throughput_to_cpu_placement_and_clocks():
    docs = []
    for launch, cpu, base in ((1, 20, 100.0), (2, 3, 120.0)):  # launch 1 off the GPU's node
        for i in range(4):
            docs.append(_engine_doc(launch, base + i, cpu=cpu, sm=1000.0 + base + i))
    assert cov.busiest(docs[0])["label"] == "VLLM::EngineCore"
    rows = {label.strip(): rel for label, rel, _ in cov.engine_rows(docs)}
    assert rows["GPU SM clock, MHz"].rho == pytest.approx(1.0)
    assert rows["GPU SM clock, MHz"].p < cov.READING_P
    local = rows["its samples on GPU-local CPUs, share"]
    assert (local.top, local.bottom, local.rho) == (1.0, 0.0, pytest.approx(0.873, abs=1e-3))
    assert local.p > cov.READING_P  # 2 of the 70 splits of 8 into 4 and 4 are as extreme
    assert rows["busiest engine main thread, cores"].rho is None  # the same everywhere
    assert rows["engine processes, cores (all threads)"].top == pytest.approx(1.4)
    text = "\n".join(cov.engine_report(docs, 4))
    assert "busiest engine process: VLLM::EngineCore" in text
    assert re.search(r"busiest engine main thread, cores +8 +- +- +0\.950 +0\.950\n", text)
    assert "reading: VLLM::EngineCore's main thread used 0.95 of a core" in text
    assert "reading: throughput rises with GPU SM clock, MHz (rho +1.00, n 8" in text
    assert "reading: throughput rises with its samples" not in text
    assert "GPU-local CPUs 0-15 (NUMA node 0)" in text
    assert "launch 1: VLLM::EngineCore on CPUs 20 (100%); allowed 0-31; 101.5 tok/s" in text


def test_without_the_engine_fields_the_block_says_so():
    doc = {"launch": 1, "role": "main", "level": 4, "output_throughput": 100.0, "monitor": {}}
    assert cov.busiest(doc) is None and cov.engine_rows([doc]) == []
    assert cov.engine_report([doc], 4) == [
        "  engine processes and GPU: not recorded in these measurements"]
