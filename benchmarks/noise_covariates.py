"""Throughput against what noise_probes saw, for `noise_sources.py analyze`: the engine block.

Per level, over the measurements of the main launches, each covariate (the busiest engine
process's main-thread CPU, its run-queue wait, its share of samples on GPU-local CPUs, its
migrations and involuntary switches; all engine processes' CPU; the GPU's SM clock and power)
against throughput: Spearman's rho with a permutation test's p (right for any n, ties
included), and the covariate's mean in the faster and in the slower half. A reading is
printed only where p < READING_P, or where a main thread is bound by its core; then where the
busiest engine process ran in each launch. Pure: measurement dicts in, lines out.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from noise_probes import parse_cpu_list

READING_P = 0.01  # 8 covariates x a few levels: at 0.05 one chance finding a run is likely
BOUND_CORES = 0.9  # a main thread at this share of a core or more is bound by that core


# --- rank correlation, and how sure it is ----------------------------------------------------
def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            out[k] = (i + j) / 2.0 + 1.0
        i = j + 1
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's r; None under 3 pairs or where either side is constant."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's r of the ranks."""
    return pearson(ranks(xs), ranks(ys))


def permutation_p(xs: Sequence[float], ys: Sequence[float], *, shuffles: int = 2000,
                  seed: int = 0) -> float | None:
    """How often shuffled pairs give a Spearman's rho at least as far from 0 as these do
    (two-sided, (hits + 1) / (shuffles + 1), a fixed seed): right for any n, ties included."""
    rho = spearman(xs, ys)
    if rho is None:
        return None
    rx, ry = ranks(xs), ranks(ys)
    rng = random.Random(seed)
    hits = 0
    for _ in range(shuffles):
        rng.shuffle(ry)
        hits += abs(pearson(rx, ry) or 0.0) >= abs(rho) - 1e-12
    return (hits + 1) / (shuffles + 1)


@dataclass(frozen=True)
class Relation:
    """Throughput against one covariate over a level's measurements: n pairs, Spearman's rho
    and its permutation p, and the covariate's mean in the faster and the slower half."""

    n: int
    rho: float | None
    p: float | None
    top: float
    bottom: float


def relate(pairs: Sequence[tuple[float, float]]) -> Relation | None:
    """(throughput, covariate) pairs; None under 2, no rho under 4 (no p could be small)."""
    pts = sorted((t, x) for t, x in pairs if math.isfinite(t) and math.isfinite(x))
    if len(pts) < 2:
        return None
    half = len(pts) // 2
    ts, xs = [t for t, _ in pts], [x for _, x in pts]
    few = len(pts) < 4
    return Relation(n=len(pts), rho=None if few else spearman(ts, xs),
                    p=None if few else permutation_p(ts, xs),
                    top=statistics.fmean(xs[-half:]), bottom=statistics.fmean(xs[:half]))


# --- the covariates, and the block analyze prints per level ----------------------------------
def busiest(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The engine process whose main thread used the most CPU (the EngineCore on a GPU)."""
    procs = doc["monitor"].get("engine") or []
    return max(procs, key=lambda p: p["main_cores"] if p["main_cores"] is not None
               else p["cores"], default=None)


def _local_share(doc: dict[str, Any]) -> float | None:
    """The busiest engine process's samples on a CPU local to the GPU, as a share."""
    local = (doc["monitor"].get("gpu") or {}).get("local_cpus")
    if not local or (b := busiest(doc)) is None:
        return None
    cpus = parse_cpu_list(local)
    return sum(n for c, n in b["cpus"].items() if int(c) in cpus) / sum(b["cpus"].values())


def _of_busiest(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda d: None if (b := busiest(d)) is None else b[key]


def _migrations(doc: dict[str, Any]) -> float | None:
    if (b := busiest(doc)) is None:
        return None
    return b["migrations_per_s"] if b["migrations_per_s"] is not None else b["cpu_changes_per_s"]


def _engine_cores(doc: dict[str, Any]) -> float | None:
    procs = doc["monitor"].get("engine")
    return sum(p["cores"] for p in procs) if procs else None


def _gpu(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda d: (d["monitor"].get("gpu") or {}).get(key)


COVARIATES: list[tuple[str, Callable[[dict[str, Any]], float | None]]] = [
    ("busiest engine main thread, cores", _of_busiest("main_cores")),
    ("  its run-queue wait, share of time", _of_busiest("main_wait_share")),
    ("  its samples on GPU-local CPUs, share", _local_share),
    ("  its migrations per s", _migrations),
    ("  its involuntary switches per s", _of_busiest("involuntary_per_s")),
    ("engine processes, cores (all threads)", _engine_cores),
    ("GPU SM clock, MHz", _gpu("sm_mhz_mean")),
    ("GPU power, W", _gpu("power_w_mean")),
]


def engine_rows(docs: Sequence[dict[str, Any]]
                ) -> list[tuple[str, Relation, list[float]]]:
    """Each covariate that these measurements hold: (label, its relation to throughput, its
    values)."""
    rows = []
    for label, get in COVARIATES:
        pairs = [(d["output_throughput"], x) for d in docs
                 if d["output_throughput"] is not None and (x := get(d)) is not None]
        if (rel := relate(pairs)) is not None:
            rows.append((label, rel, [x for _, x in pairs]))
    return rows


def readings(rows: Sequence[tuple[str, Relation, list[float]]], name: str) -> list[str]:
    """What the rows support: the busiest main thread bound by its core (mean at BOUND_CORES
    or more), and each covariate whose rho a permutation test puts at p < READING_P."""
    out = []
    for label, rel, values in rows:
        if label.startswith("busiest") and statistics.fmean(values) >= BOUND_CORES:
            out.append(f"{name}'s main thread used {statistics.fmean(values):.2f} of a core "
                       f"(>= {BOUND_CORES}): bound by its CPU")
        if rel.rho is not None and rel.p is not None and rel.p < READING_P:
            out.append(f"throughput {'rises' if rel.rho > 0 else 'falls'} with "
                       f"{label.strip()} (rho {rel.rho:+.2f}, n {rel.n}, p {_p_text(rel.p)})")
    return out


def _p_text(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _cpu_text(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    more = f" +{len(counts) - 3}" if len(counts) > 3 else ""
    return ", ".join(f"{c} ({100 * n / total:.0f}%)" for c, n in top) + more


def placement_lines(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Per launch, where the busiest engine process ran: its CPUs over every measurement of
    the level (share of samples), and the CPUs it was allowed."""
    out = []
    for k in sorted({d["launch"] for d in docs}):
        mine = [d for d in docs if d["launch"] == k and busiest(d) is not None]
        if not mine:
            continue
        counts: dict[str, int] = {}
        for d in mine:
            for c, n in busiest(d)["cpus"].items():
                counts[c] = counts.get(c, 0) + n
        last = busiest(mine[-1])
        tput = statistics.fmean(d["output_throughput"] for d in mine)
        out.append(f"  launch {k}: {last['label']} on CPUs {_cpu_text(counts)}; allowed "
                   f"{last['allowed']}; {tput:.1f} tok/s")
    return out


def _short(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3f}"


def engine_report(docs: Sequence[dict[str, Any]], level: int) -> list[str]:
    """The level's throughput against the engine's CPU, placement and the GPU's clocks, over
    every measurement of the main launches."""
    mine = [d for d in docs if d["level"] == level and d["role"] == "main"]
    rows = engine_rows(mine)
    if not rows:
        return ["  engine processes and GPU: not recorded in these measurements"]
    names = [b["label"] for d in mine if (b := busiest(d)) is not None]
    name = max(set(names), key=names.count) if names else "?"
    gpu = next((d["monitor"]["gpu"] for d in mine if d["monitor"].get("gpu")), {})
    where = ("no nvidia-smi on this host" if gpu.get("probe") == "missing" else
             f"GPU-local CPUs {gpu.get('local_cpus')} (NUMA node {gpu.get('numa_node')})")
    lines = [f"  engine and GPU against throughput, {len(mine)} measurements (busiest engine "
             f"process: {name}; {where})",
             f"  {'covariate':44} {'n':>3} {'rho':>6} {'p':>6} {'faster half':>12} "
             f"{'slower half':>12}"]
    for label, rel, _ in rows:
        rho = "-" if rel.rho is None else f"{rel.rho:+.2f}"
        p = "-" if rel.p is None else _p_text(rel.p)
        lines.append(f"  {label:44} {rel.n:3d} {rho:>6} {p:>6} "
                     f"{_short(rel.top):>12} {_short(rel.bottom):>12}")
    return lines + [f"  reading: {r}" for r in readings(rows, name)] + placement_lines(mine)
