"""A drafter's K axis in words (tuner/outputs/drafter_k.py): every K at every level, the
cost's calibration said, and a line per miss, from the record's fields."""

from __future__ import annotations

from tuner.outputs import drafter_k as drafter_words
from tuner.records.configs import TrialConfig
from tuner.records.drafter_k import KLaunch, KLevel
from tuner.replay import drafter_k

RATES = (0.9, 0.8, 0.7)
CFG = TrialConfig(speculative_config={"method": "draft_model", "model": "/m/d",
                                      "num_speculative_tokens": 3})


def _level(k: int, *, length: float | None = None, thr: float = 100.0) -> KLevel:
    return KLevel(concurrency=1, drafts=2000.0 if k else 0.0, per_position=RATES[:k],
                  acceptance_length=length or 1 + sum(RATES[:k]), decode_ms_per_token=10.0,
                  output_throughput=thr, mean_ttft_ms=20.0, mean_tpot_ms=10.0,
                  tokens_per_request=64.0)


def _axis(*launched: KLaunch):
    return drafter_k.axis(CFG, launched, {1: _level(0)})


def _launch(k: int, **kw) -> KLaunch:
    return KLaunch(number=k, k=k, key=CFG.with_k(k).key(), levels=(_level(k, **kw),))


def test_every_k_is_listed_and_one_launch_says_its_cost_is_not_calibrated() -> None:
    ax = _axis(_launch(3))
    text = drafter_words.axes_text([ax])
    assert "every K 1-3" in text and "not calibrated" in text
    lines = [ln.split()[0] for ln in text.splitlines() if ln[:1].isdigit()]
    assert lines == ["1", "2", "3"]
    assert "MISS" not in text


def test_a_miss_has_its_line_with_both_figures_and_the_stated_accuracy() -> None:
    ax = _axis(_launch(3), _launch(1), _launch(2, length=2.0))
    [miss] = ax.misses()
    assert miss.k == 2 and miss.acceptance_miss
    text = drafter_words.axes_text([ax])
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("MISS"))
    predicted = drafter_k.acceptance_at(RATES, 2, drafts=2000.0)[0]
    assert "K=2 c=1" in line and f"{predicted:.2f} predicted, 2.00 measured" in line
    assert f"{miss.acceptance_accuracy_pct:.1f}%" in line
    assert "calibrated on launches at K=1,3" in text


def test_a_miss_is_kept_as_the_study_keeps_every_replay_miss() -> None:
    ax = _axis(_launch(3), _launch(1), _launch(2, length=2.0))
    [m] = drafter_k.prediction_misses(ax)
    assert (m.concurrency, m.label, m.measured) == (1, "draft_model k=2 model=/m/d", 2.0)
    assert m.predicted == drafter_k.acceptance_at(RATES, 2, drafts=2000.0)[0]
    assert m.error_pct == ax.misses()[0].err_acceptance_length_pct
