"""Replay stage, the launches of model-based drafters as K axes: each launched drafter's
launches grouped by config without K, their medians per K and level, against the baseline,
handed to tuner.replay.drafter_k, which predicts every K up to the largest launched.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from tuner.records.drafter_k import DrafterAxis, KLaunch, KLevel
from tuner.replay import cost, drafter_k
from tuner.replay.measured import MeasuredTrial, by_config, finite, median_level, pooled
from tuner.speculative.schedule_rules import autoregressive_drafter


def drafter_axes(measured: Sequence[MeasuredTrial], costs: dict[int, cost.StepCost],
                 levels: Sequence[int], *, max_num_seqs: int, calibrate: bool = True
                 ) -> list[DrafterAxis]:
    """The K axis of every launched model-based drafter (tuner.replay.drafter_k): its
    launches grouped by config without K (a K schedule is another config), each K's levels
    the medians over its launches, against the baseline (the aligned one's step where the
    study measured one, the plain one's throughput); the verify part of the drafter's cost
    per token from the study's step cost where it is calibrated. `calibrate` False: the cost
    on each drafter's largest K alone (what one launch predicts), the others out of sample."""
    groups: dict[str, list[MeasuredTrial]] = {}
    for m in measured:
        spec = m.config.speculative_config or {}
        if (m.speculative and autoregressive_drafter(m.config.method)
                and m.config.k and "num_speculative_tokens_per_batch_size" not in spec):
            groups.setdefault(m.config.with_k(1).key(), []).append(m)
    plain = pooled([m for m in measured if m.role == "baseline"])
    anchor = pooled([m for m in measured if m.aligned]) or plain
    baseline = {c: dataclasses.replace(lv, output_throughput=plain[c]["output_throughput"])
                for c in levels if c in anchor and c in plain
                and (lv := _k_level(anchor[c], c)) is not None}
    verify = {c: s.b * min(c, max_num_seqs) for c, s in costs.items() if s.calibrated}
    out = []
    for group in groups.values():
        launches = []
        for key, same in by_config(group).items():
            lvs = tuple(lv for c in levels if (lv := _k_level(_level_of(same, c), c)) is not None)
            if lvs:
                launches.append(KLaunch(number=min(m.number for m in same),
                                        k=int(same[0].config.k), key=key, levels=lvs,
                                        trials=len(same)))
        if launches:
            source = max(launches, key=lambda lc: lc.k)
            cfg = next(m.config for m in group if m.config.key() == source.key)
            out.append(drafter_k.axis(cfg, launches, baseline, verify_ms_per_token=verify,
                                      calibrate=calibrate))
    return out


def _level_of(group: Sequence[MeasuredTrial], c: int) -> dict[str, Any] | None:
    """median_level with vLLM's draft counts and per-position rates (medians per position
    over the group's launches) beside it."""
    lv = median_level(group, c)
    levels = [m.levels[c] for m in group if c in m.levels]
    if lv is None:
        return None
    positions = [x.spec_decode_per_position_acceptance_rates for x in levels]
    width = min((len(p) for p in positions), default=0)
    lv["per_position"] = tuple(statistics.median(p[i] for p in positions) for i in range(width))
    lv["drafts"] = statistics.median(x.spec_decode_num_drafts for x in levels)
    lv["tokens_per_request"] = statistics.median(
        x.total_output_tokens / x.completed for x in levels if x.completed) \
        if any(x.completed for x in levels) else None
    return lv


def _k_level(lv: dict[str, Any] | None, c: int) -> KLevel | None:
    """A level's medians (`_level_of`, or a baseline's `median_level`) as the K axis reads
    them; None where a figure it needs is missing."""
    if lv is None:
        return None
    needed = ("decode_ms_per_token", "output_throughput", "mean_ttft_ms", "mean_tpot_ms")
    if not all(finite(lv.get(n)) for n in needed):
        return None
    length = lv.get("spec_decode_acceptance_length")
    return KLevel(concurrency=c, drafts=float(lv.get("drafts") or 0.0),
                  per_position=tuple(lv.get("per_position") or ()),
                  acceptance_length=length if finite(length) else 1.0,
                  decode_ms_per_token=lv["decode_ms_per_token"],
                  output_throughput=lv["output_throughput"], mean_ttft_ms=lv["mean_ttft_ms"],
                  mean_tpot_ms=lv["mean_tpot_ms"],
                  tokens_per_request=float(lv.get("tokens_per_request") or 0.0))
