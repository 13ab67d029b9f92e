"""The load-aware policy in words (tuner.outputs.policy_words): each sentence follows from
the document's figures, which tuner.analysis.policy decides."""

from __future__ import annotations

from tuner.outputs import policy_words as words
from tuner.records.policy import (
    ConfigCurve,
    LevelStat,
    PolicyDocument,
    ScheduleVerification,
    VerificationRow,
)

BANDS = ((1, 6, 5), (7, 128, 0))


def _row(c: int, speedup: float, *, below: bool = False) -> VerificationRow:
    return VerificationRow(concurrency=c, policy_speedup=speedup, policy_noise=0.01,
                           static_speedup=speedup - 0.01, below_baseline_beyond_noise=below)


def _doc(**fields) -> PolicyDocument:
    return PolicyDocument(**{"method": "ngram", "chosen": "ngram k=5", "bands": BANDS, **fields})


def test_band_table_fallback_wording():
    # The last band runs to the engine's batch limit, whatever that is.
    for limit in (128, 1024):
        lines = words.band_table([(1, 6, 5), (7, limit, 0)], "ngram k=5")
        assert lines == ["concurrency 1-6: speculate with ngram k=5, K=5",
                         "concurrency 7 and above: speculation off"]


def test_a_verified_schedule_says_how_it_fared_and_needs_no_router():
    ver = ScheduleVerification(engine_rejected=False,
                               rows=(_row(1, 1.88), _row(4, 0.93, below=True)),
                               worse_at=(4,))
    # The chosen config's ladder split at c=1 (aligned baseline measured): the headline's last
    # sentence says whether the path or speculation itself decided.
    split = LevelStat(speedup=1.88, noise=0.01, throughput=18.8, baseline=10.0, n=2,
                      n_baseline=2, path_cost=0.9, path_noise=0.01, speculation_gain=1.88 / 0.9,
                      gain_noise=0.02)
    curve = ConfigCurve(label="ngram k=5", role="leader", stats={1: split})
    doc = words.worded(_doc(schedule=BANDS, speculative_config={"method": "ngram"},
                            verification=ver, configs=(curve,)))
    assert doc.verification.headline == (
        "The policy fell below the baseline beyond the noise at concurrency 4; at concurrency "
        "1 it keeps 1.88x against the static config's 1.87x.")
    assert doc.decomposition == (
        "ngram k=5 over the plain baseline, split into the engine path's cost (aligned baseline "
        "over plain) and speculation's own gain: c=1 1.88x \u00b10.02 = path 0.90x \u00b10.01 x "
        "speculation 2.09x \u00b10.04.")
    assert doc.headline == doc.verification.headline + " " + doc.decomposition
    unsplit = words.worded(_doc(configs=(curve.model_copy(update={"stats": {}}),)))
    assert unsplit.decomposition is None
    assert not doc.needs_router and doc.fallback_bands is None


def test_an_ignored_or_refused_schedule_words_the_router_table():
    ignored = ScheduleVerification(engine_rejected=False, honoured=False, rows=(_row(1, 1.5),))
    doc = words.worded(_doc(schedule=BANDS, speculative_config={"method": "ngram"},
                            verification=ignored))
    assert doc.needs_router and doc.headline.startswith("Verified on the ladder")
    assert doc.headline.endswith("it ignored the schedule; use the band table in a router.")
    assert doc.fallback_bands == tuple(words.band_table(BANDS, "ngram k=5"))
    rejected = ScheduleVerification(engine_rejected=True, reason="vLLM exited with status 1")
    doc = words.worded(_doc(schedule=BANDS, speculative_config={"method": "ngram"},
                            verification=rejected))
    assert doc.headline == ("The installed vLLM did not run the schedule (vLLM exited with "
                           "status 1); use the band table below in a router instead.")
    assert doc.needs_router and len(doc.fallback_bands) == 2


def test_speculation_off_and_a_schedule_not_yet_verified():
    assert words.worded(_doc(bands=((1, 128, 0),))).headline == words.SPECULATION_OFF
    assert words.headline(_doc(schedule=BANDS, speculative_config={"method": "ngram"})) is None
