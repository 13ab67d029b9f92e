"""Policy stage: where speculation stops paying, and the per-batch-size schedule vLLM takes.

From the leading configs of a study we measure a concurrency ladder (1, 2, 4, ... in one engine
launch per config and repeat, interleaved with the baseline), find each config's break-even
concurrency (speedup over the baseline falls to 1 within the measured noise), choose per band
of concurrency the best K for the chosen method (K never rises with load, so neighbouring
bands cannot flip-flop), emit `num_speculative_tokens_per_batch_size` where the method's
proposer takes a changing K (tuner.speculative.varying_k, handed in by tuner.api; else the
bands, a static K each, and why). Where the study has an aligned baseline (no speculation on
the speculative engine path), the ladder measures it too and every speedup over the plain
baseline is split into path cost (aligned over plain) x speculation gain (config over
aligned), each with its noise; the decisions stay against the plain baseline, which is what a
user gets. This module plans the ladder (leaders, ladder_lineup) and drafts the document as a
record (PolicyDocument, figures only) from the rules of tuner.analysis.schedule over
tuner.analysis.ladder_stats; tuner.analysis.schedule_verification verifies the emitted config
on the same ladder and tuner.analysis.open_loop at each band edge. tuner.outputs.policy_words
words it, tuner/search/ladder.py measures and tuner/api/policy_pipeline.py runs the whole step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.analysis import frame
from tuner.analysis.ladder_stats import level_stats, split_stats, throughput_series
from tuner.analysis.schedule import (
    bands,
    break_even,
    choose_k,
    policy_config,
    schedule_refused,
    validate_schedule,
    withheld,
)
from tuner.errors import ConfigError
from tuner.records.configs import TrialConfig
from tuner.records.policy import (
    ConfigCurve,
    LadderRun,
    LevelSpeedup,
    LevelStat,
    PathCostCurve,
    PathRule,
    PolicyContext,
    PolicyDocument,
    ScheduleBasis,
)
from tuner.records.trials import Role

if TYPE_CHECKING:
    import pandas as pd


def ladder_lineup(picks: list[TrialConfig], k_values: tuple[int, ...] | None, *, study: str,
                  aligned: TrialConfig | None = None) -> list[tuple[Role, TrialConfig]]:
    """What the ladder measures, as (role, config): the baseline, the study's aligned baseline
    where it has one, the leaders, and K variants of the first leader (by default its K and
    half of it)."""
    if not picks:
        raise ConfigError(f"Study '{study}' has no completed speculative trial yet; run "
                          f"`tuner optimize` first (the policy starts from its leading configs).")
    chosen = picks[0]
    # Where vLLM takes K from the draft model (chosen.k is None), only asked-for Ks vary.
    default_ks = (chosen.k, max(1, round(chosen.k / 2))) if chosen.k else ()
    ks = sorted(set(k_values or default_ks), reverse=True)
    lineup: list[tuple[Role, TrialConfig]] = [(Role.BASELINE, TrialConfig())]
    if aligned is not None:
        lineup.append((Role.ALIGNED_BASELINE, aligned))
    lineup += [(Role.LEADER, c) for c in picks]
    for k in ks:
        cfg = chosen.with_k(k)
        # The leader's own K is the leader, however its config spells it.
        if k != chosen.k and cfg.key() not in {c.key() for _, c in lineup}:
            lineup.append((Role.K_VARIANT, cfg))
    return lineup


def draft_policy(ladder_runs: Sequence[LadderRun], lineup: list[tuple[Role, TrialConfig]], *,
                 max_batch: int, where: str, context: PolicyContext | None = None,
                 predicted: dict[int, dict[int, float]] | None = None,
                 varying_k: tuple[bool, str] | None = None,
                 path_rule: PathRule | None = None) -> PolicyDocument:
    """The policy document from the ladder: per config of the `lineup` its speedup per level
    and break-even, K per level for the first leader's method, the schedule up to `max_batch`
    (the engine's max_num_seqs) and the speculative config that carries it (None:
    speculation does not pay anywhere). Verification is added later. `context`: what the step
    was run on, copied to the top of the document.

    `predicted` ({K: {level: speedup}}, the replay's curves for the chosen config) adds every
    K the ladder did not measure; such a K must pay by more than the chosen leader's measured
    noise at that level, and the schedule it enters is verified on the engine like any other.

    `varying_k` ((accepted, why): whether the chosen method's proposer takes a changing K,
    tuner.speculative.varying_k) decides whether a schedule is emitted: where it is not
    accepted and K differs across bands, the document has no schedule and no config to verify
    (schedule None, speculative_config None), the bands and why (`schedule_refused`).
    `path_rule` (tuner.speculative.schedule_path's answer for the chosen config's engine path,
    handed in by tuner.api) withholds the schedule the same way where vLLM's source says the
    table moves the engine off the path the bands were measured on (`schedule_check`, basis
    PATH_PREDICTED): no launch is spent on it.
    The document's sentences are tuner.outputs.policy_words'."""
    chosen = _leader(lineup)
    base = throughput_series(ladder_runs, TrialConfig().key())
    if not base:
        raise ConfigError("The baseline could not be measured on the ladder (see the failures "
                          f"in {where}); no policy without it.")
    aligned = next((c for role, c in lineup if role == Role.ALIGNED_BASELINE), None)
    aligned_series = throughput_series(ladder_runs, aligned.key()) if aligned is not None else {}
    stats = {c.key(): split_stats(throughput_series(ladder_runs, c.key()), base, aligned_series)
             for _, c in lineup if c.method != "none"}
    per_k = _measured_ks(lineup, stats, chosen)
    measured_ks = sorted(per_k)
    per_k.update(_predicted_ks(predicted or {}, per_k, stats.get(chosen.key(), {})))
    picked = choose_k(per_k)
    schedule = bands(picked, per_k, max_batch=max_batch)
    spec = policy_config(chosen, schedule, varying_k=varying_k)
    refused = schedule_refused(schedule, varying_k)
    check = None
    if refused is None and spec is not None and path_rule is not None and path_rule.changes \
            and len({k for *_, k in schedule}) > 1:
        check = withheld(schedule, basis=(ScheduleBasis.PATH_PREDICTED,),
                         changes=path_rule.changes, vllm_source=path_rule.vllm_source)
        spec = None
    k_predicted = sorted(k for k in per_k if k not in measured_ks)
    doc = PolicyDocument(
        **dict(context or PolicyContext()), method=chosen.method, chosen=chosen.label(),
        configs=tuple(ConfigCurve(label=c.label(), role=role,
                                  speculative_config=c.speculative_config,
                                  stats=stats.get(c.key(), {}),
                                  break_even=break_even(stats[c.key()]) if stats.get(c.key())
                                  else None) for role, c in lineup if c.method != "none"),
        baseline=base, k_by_level=picked,
        schedule=None if refused or check else tuple(schedule),
        bands=tuple(schedule), schedule_refused=refused, k_measured=tuple(measured_ks),
        # Every K the bands chose from, measured or predicted: its closed-loop speedup and
        # noise per level (the open-loop check's merges must not give any of it up).
        k_stats={k: {c: LevelSpeedup(speedup=st.speedup, noise=st.noise)
                     for c, st in per_k[k].items()} for k in sorted(per_k)},
        k_predicted=tuple(k_predicted),
        predicted_speedups={k: {c: round(v, 4) for c, v in curve.items()}
                            for k, curve in (predicted or {}).items()},
        schedule_problems=tuple(validate_schedule(schedule, num_speculative_tokens=max(
            [k for *_, k in schedule] + [1]))),
        speculative_config=None if spec is None else spec.speculative_config,
        aligned_baseline=None if aligned is None else PathCostCurve(
            label=aligned.label(), config=aligned, path_cost=level_stats(aligned_series, base)),
        path_rule=path_rule, schedule_check=check,
    )
    return doc


def _leader(lineup: list[tuple[Role, TrialConfig]]) -> TrialConfig:
    """The first leader: the config whose method and K the policy schedules."""
    return next(c for role, c in lineup if role == Role.LEADER)


def _measured_ks(lineup: list[tuple[Role, TrialConfig]], stats: dict[str, dict[int, LevelStat]],
                 chosen: TrialConfig) -> dict[int, dict[int, LevelSpeedup]]:
    """{K: level stats} of the ladder's configs that are the chosen one but for K."""
    return {c.k: stats[c.key()] for _, c in lineup
            if c.method == chosen.method and c.k is not None and stats.get(c.key())
            and c.speculative_config_without_k() == chosen.speculative_config_without_k()}


def _predicted_ks(predicted: dict[int, dict[int, float]],
                  per_k: dict[int, dict[int, LevelSpeedup]], leader_stats: dict[int, LevelStat]
                  ) -> dict[int, dict[int, LevelSpeedup]]:
    """The replay's curves of the Ks the ladder did not measure (measured beats predicted),
    each level held to the chosen leader's measured noise there."""
    return {k: {c: LevelSpeedup(speedup=s, noise=leader_stats[c].noise)
                for c, s in curve.items() if c in leader_stats}
            for k, curve in predicted.items() if k not in per_k}


def policy_configs(doc: PolicyDocument, lineup: list[tuple[Role, TrialConfig]]
                   ) -> tuple[TrialConfig, TrialConfig]:
    """(the emitted policy, the static config it replaces: the first leader at its own K)."""
    chosen = _leader(lineup)
    policy_cfg = chosen.model_copy(update={"speculative_config": doc.speculative_config})
    return policy_cfg, chosen


def leaders(df: pd.DataFrame, n: int) -> list[TrialConfig]:
    """Best completed config per method at the lowest level (medians over repeats)."""
    ok = frame.with_medians(df)
    ok = ok[(ok["state"] == "COMPLETE") & (ok["method"] != "none")]
    if ok.empty:
        return []
    low = ok[ok["concurrency"] == ok["concurrency"].min()]
    best = low.sort_values("output_throughput", ascending=False).drop_duplicates("method")
    configs = frame.configs_of(df)
    return [configs[key] for key in best.head(n)["config_key"]]
