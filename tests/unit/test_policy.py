"""Band construction and schedule format: the rules of the load-aware policy."""

from __future__ import annotations

import pytest
from study_fakes import ladder_runs

from tuner.analysis import ladder_stats as LS
from tuner.analysis import policy as P
from tuner.analysis import schedule as S
from tuner.analysis import schedule_verification as V
from tuner.outputs import policy_words
from tuner.records.configs import TrialConfig
from tuner.records.policy import BreakEvenStatus, LevelStat, PolicyDocument


def stats_from(speedups: dict[int, float], noise: float = 0.03) -> dict[int, LevelStat]:
    return {c: LevelStat(speedup=s, noise=noise, throughput=s, baseline=1.0, n=3, n_baseline=3)
            for c, s in speedups.items()}


def _ngram(spec: dict) -> TrialConfig:
    return TrialConfig(speculative_config=spec)


def test_level_stats_medians_and_noise():
    st = LS.level_stats({1: [20.0, 22.0, 21.0]}, {1: [10.0, 10.0, 10.0]})
    assert st[1].speedup == pytest.approx(2.1)
    assert st[1].noise == pytest.approx(1.0 / 21.0)  # MAD 1 over median 21
    single = LS.level_stats({1: [20.0]}, {1: [10.0]})
    assert single[1].noise == LS.UNMEASURED_NOISE


def test_break_even_monotone_crossing_is_interpolated_in_log2():
    be = S.break_even(stats_from({1: 2.0, 2: 1.6, 4: 1.2, 8: 0.8, 16: 0.6}))
    assert be.status is BreakEvenStatus.CROSSES
    assert (be.last_paying, be.first_not_paying) == (4, 8)
    assert be.concurrency == pytest.approx(2 ** 2.5, rel=1e-3)  # halfway in log2


def test_break_even_always_and_never():
    assert S.break_even(stats_from({1: 2.0, 8: 1.5})).status is BreakEvenStatus.ALWAYS_PAYS
    assert S.break_even(stats_from({1: 1.01, 8: 0.7})).status is BreakEvenStatus.NEVER_PAYS


def test_break_even_within_noise_counts_as_not_paying():
    be = S.break_even(stats_from({1: 1.5, 2: 1.02, 4: 1.3}, noise=0.05))
    assert be.first_not_paying == 2


def test_monotone_data_gives_decreasing_bands_and_off_at_high_load():
    per_k = {5: stats_from({1: 2.1, 2: 1.7, 4: 1.2, 8: 0.9, 16: 0.7}),
             2: stats_from({1: 1.6, 2: 1.5, 4: 1.3, 8: 1.02, 16: 0.9})}
    chosen = S.choose_k(per_k)
    assert chosen == {1: 5, 2: 5, 4: 2, 8: 0, 16: 0}
    sched = S.bands(chosen, per_k, max_batch=256)
    assert sched[0][0] == 1 and sched[-1][1] == 256
    assert [k for *_, k in sched] == [5, 2, 0]
    assert not S.validate_schedule(sched, num_speculative_tokens=5)
    # K=2 stops paying between 4 and 8: the off band starts inside (4, 8].
    assert 5 <= sched[-1][0] <= 8


def test_noisy_data_never_flip_flops():
    per_k = {4: stats_from({1: 1.8, 2: 0.97, 4: 1.4, 8: 1.1, 16: 1.5}, noise=0.05)}
    chosen = S.choose_k(per_k)
    assert chosen == {1: 4, 2: 0, 4: 0, 8: 0, 16: 0}
    ks = [k for *_, k in S.bands(chosen, per_k, max_batch=1024)]
    assert ks == sorted(ks, reverse=True)


def test_config_that_never_pays_turns_speculation_off():
    per_k = {5: stats_from({1: 1.02, 4: 0.8})}
    sched = S.bands(S.choose_k(per_k), per_k, max_batch=1024)
    assert sched == [(1, 1024, 0)]
    assert S.policy_config(_ngram({"method": "ngram", "num_speculative_tokens": 5}), sched) is None


def test_config_that_always_pays_is_a_static_config():
    per_k = {5: stats_from({1: 2.0, 16: 1.3})}
    sched = S.bands(S.choose_k(per_k), per_k, max_batch=256)
    assert sched == [(1, 256, 5)]
    cfg = S.policy_config(_ngram({"method": "ngram", "num_speculative_tokens": 5}), sched)
    assert cfg.speculative_config == {"method": "ngram", "num_speculative_tokens": 5}


def test_policy_config_embeds_the_schedule_with_k_max():
    spec = S.policy_config(_ngram({"method": "ngram", "num_speculative_tokens": 3,
                                   "prompt_lookup_min": 2}), [(1, 4, 5), (5, 1024, 0)]
                           ).speculative_config
    assert spec["num_speculative_tokens"] == 5
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 5], [5, 1024, 0]]


@pytest.mark.parametrize("sched, problem", [
    ([], "empty"),
    ([(2, 4, 1)], "must start at 1"),
    ([(1, 4, 1), (4, 8, 0)], "overlapping"),
    ([(1, 4, 1), (3, 2, 0)], "start 3 > end 2"),
    ([(1, 4, -1)], "K -1 < 0"),
    ([(1, 4, 9)], "K 9 > num_speculative_tokens"),
    ([(0, 4, 1)], "must be positive"),
])
def test_validate_schedule_flags_each_vllm_rule(sched, problem):
    problems = S.validate_schedule(sched, num_speculative_tokens=5)
    assert any(problem in p for p in problems), problems


def test_our_validation_agrees_with_vllms_own_validator():
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils",
                                reason="vLLM not installed")
    cases = [[(1, 4, 5), (5, 1024, 0)], [(2, 4, 1)], [(1, 4, 1), (4, 8, 0)], [(1, 3, 2)],
             [(1, 4, 1), (3, 2, 0)], [(0, 4, 1)], [(1, 2, 3), (3, 9, 1), (10, 99, 0)]]
    for sched in cases:
        ours = S.validate_schedule(sched, num_speculative_tokens=5)
        try:
            utils.validate_and_normalize_dynamic_sd_schedule([list(e) for e in sched])
            theirs_ok = True
        except ValueError:
            theirs_ok = False
        assert (not ours) == theirs_ok, (sched, ours)


def _ladder_runs(key: str, speedups: dict[int, list[float]]):
    """Stored campaign runs of one config: one run per repeat, throughput = speedup x 10."""
    return ladder_runs(key, {c: [10 * x for x in s] for c, s in speedups.items()})


def test_predicted_ks_join_the_choice_and_are_named_in_the_document():
    spec = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4}
    k6 = TrialConfig(speculative_config=spec)
    k3 = TrialConfig(speculative_config={**spec, "num_speculative_tokens": 3})
    lineup = [("baseline", TrialConfig()), ("leader", k6), ("k_variant", k3)]
    measured = (_ladder_runs(TrialConfig().key(), {1: [1.0, 1.0], 4: [1.0, 1.02]})
                + _ladder_runs(k6.key(), {1: [2.0, 2.04], 4: [1.05, 1.07]})
                + _ladder_runs(k3.key(), {1: [1.6, 1.62], 4: [1.12, 1.13]}))
    # K=2 predicted to pay best at c=4; K=3 predicted too, but measured wins for K=3.
    predicted = {2: {1: 1.4, 4: 1.25}, 3: {1: 9.0, 4: 9.0}}
    doc = P.draft_policy(measured, lineup, max_batch=8, where="x", predicted=predicted)
    assert doc.k_by_level == {1: 6, 4: 2}
    assert doc.k_measured == (3, 6) and doc.k_predicted == (2,)
    assert doc.schedule[0] == (1, doc.schedule[0][1], 6)
    assert doc.schedule[-1][2] == 2
    without = P.draft_policy(measured, lineup, max_batch=8, where="x")
    assert without.k_by_level == {1: 6, 4: 3} and without.k_predicted == ()


def test_with_an_aligned_baseline_each_speedup_splits_into_path_cost_and_speculation_gain():
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}
    k3 = TrialConfig(speculative_config=spec)
    aligned = TrialConfig(engine_args={"no_async_scheduling": True},
                          engine_env={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    lineup = P.ladder_lineup([k3], (3,), study="s", aligned=aligned)
    assert [role for role, _ in lineup] == ["baseline", "aligned_baseline", "leader"]
    # The H200 study of issue 16: the path costs 0.83x at c=1, speculation gains 1.28x there.
    measured = (_ladder_runs(TrialConfig().key(), {1: [10.0, 10.2], 8: [10.0, 10.0]})
                + _ladder_runs(aligned.key(), {1: [8.3, 8.3], 8: [8.0, 8.1]})
                + _ladder_runs(k3.key(), {1: [10.6, 10.7], 8: [9.0, 9.0]}))
    doc = P.draft_policy(measured, lineup, max_batch=8, where="x")
    stats = doc.configs[0].stats
    assert stats[1].path_cost == pytest.approx(8.3 / 10.1)
    assert stats[1].speculation_gain == pytest.approx(10.65 / 8.3)
    for c in (1, 8):
        assert stats[c].path_cost * stats[c].speculation_gain == pytest.approx(stats[c].speedup)
        assert stats[c].path_noise > 0 and stats[c].gain_noise > 0
    assert doc.aligned_baseline.path_cost[1].speedup == pytest.approx(8.3 / 10.1)
    # Each ratio with its spread, in the ratio's units, as the recommendation and report say.
    assert "c=1 1.05x \u00b10.01 = path 0.82x \u00b10.01 x speculation 1.28x \u00b10.01" in \
        policy_words.worded(doc).decomposition
    # The decisions stay against the plain baseline, what a user gets today: at c=8
    # speculation alone gains 1.12x, yet on its path it is 0.9x of the plain baseline.
    assert stats[8].speculation_gain > 1.1 and stats[8].speedup < 0.95
    assert doc.k_by_level == {1: 3, 8: 0}
    policy_cfg, static = P.policy_configs(doc, lineup)
    verified = V.with_verification(doc, measured, policy_cfg=policy_cfg, static=static,
                                   side_by_side=False)
    # The line a user reads says whether the path or speculation itself decided.
    assert policy_words.worded(verified).headline.endswith(policy_words.worded(doc).decomposition)

    plain = P.draft_policy(measured, [r for r in lineup if r[0] != "aligned_baseline"],
                           max_batch=8, where="x")
    assert policy_words.worded(plain).decomposition is None and plain.aligned_baseline is None
    assert plain.configs[0].stats[1].path_cost is None
    # Without the split, a level's JSON has no split keys (policy.json as before).
    assert "path_cost" not in plain.configs[0].stats[1].model_dump()
    assert "path_cost" in stats[1].model_dump()


def test_the_ladder_varies_k_as_vllm_resolves_it():
    ngram = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 6,
                                            "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    lineup = P.ladder_lineup([ngram], None, study="s")
    assert [(role, c.k) for role, c in lineup] == [("baseline", None), ("leader", 6),
                                                 ("k_variant", 3)]
    assert lineup[2][1] == ngram.with_k(3)
    # suffix leaves K to its tree depth (TrialConfig.k): the variant halves that, and the
    # leader's own K is not measured twice.
    suffix = TrialConfig(speculative_config={"method": "suffix",
                                             "suffix_decoding_max_tree_depth": 8})
    assert [c.k for _, c in P.ladder_lineup([suffix], None, study="s")] == [None, 8, 4]
    # EAGLE takes K from the draft model: only the Ks asked for vary.
    eagle = TrialConfig(speculative_config={"method": "eagle", "model": "org/draft"})
    assert [role for role, _ in P.ladder_lineup([eagle], None, study="s")] == ["baseline",
                                                                           "leader"]
    assert [c.k for _, c in P.ladder_lineup([eagle], (2,), study="s")] == [None, None, 2]
    # The static config the policy replaces is the leader as measured.
    doc = PolicyDocument(method="ngram", chosen=ngram.label(), speculative_config={
        **ngram.speculative_config, "num_speculative_tokens_per_batch_size": [[1, 4, 6]]})
    policy_cfg, static = P.policy_configs(doc, lineup)
    assert static == ngram and policy_cfg.speculative_config == doc.speculative_config


def test_leaders_are_the_frames_config_records():
    from study_fakes import realistic_study

    from tuner.analysis.frame import configs_of, trials_frame

    df = trials_frame(realistic_study())
    picks = P.leaders(df, 2)
    assert [c.method for c in picks] == ["suffix", "ngram"]
    assert all(c is configs_of(df)[c.key()] for c in picks)


def test_a_k_variant_of_a_synthetic_config_carries_one_rate_per_drafted_position():
    # On the H100 the policy's k=2 variant of a k=3 draft-model config kept three synthetic
    # rates, and vLLM refused it at start-up ("synthetic_acceptance_rates must have length 2").
    k3 = TrialConfig(speculative_config={"method": "draft_model", "model": "d",
                                         "num_speculative_tokens": 3}
                     ).with_acceptance_profile([0.81, 0.72, 0.63])
    assert k3.with_k(2).speculative_config["synthetic_acceptance_rates"] == [0.81, 0.72]
    assert k3.with_k(5).speculative_config["synthetic_acceptance_rates"] == [
        0.81, 0.72, 0.63, 0.63, 0.63]
    assert "synthetic_acceptance_rates" not in TrialConfig(speculative_config={
        "method": "ngram", "num_speculative_tokens": 3}).with_k(2).speculative_config
