"""On the stored GPU sets (vLLM 0.26 on an H100 and an H200), every n-gram launch ran the V1
proposer, and modeling the V2 proposer beside it changed none of their predictions.

tests/data/ngram_v1_stored_sets.json holds what the tuner before V2 was modeled (commit
d639cb8) made of every n-gram launch of those sets: its config replayed over its own tokens
and over its set's baseline tokens, at every level, as vLLM's spec-decode counters count.
tests/ngram_stored_sets.py says how it was written. The replay on the path the launches
recorded must give exactly those counts. docs/accuracy.md's own test
(tests/integration/test_accuracy_doc.py) holds the whole predictions (throughput, TPOT) of the
H200 sets unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ngram_stored_sets as stored
import pytest

from tuner import api
from tuner.measure import enginepath
from tuner.replay import ngram_v2
from tuner.search import study as st
from tuner.search import trials

pytestmark = pytest.mark.vllm

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "ngram_v1_stored_sets.json"
H100_STUDY = stored.DATA / "h100" / "ngram-study-32p-c1c8"


def test_every_stored_ngram_launch_recorded_the_v1_proposer() -> None:
    recorded = {}
    for name in stored.SETS[1:]:  # their engine logs' path lines
        for x in stored.launches(name):
            if x.spec and x.log is not None:
                recorded[f"{name} {x.name}"] = _ngram_path(x.log, x.spec["method"])
    study = st.open_existing(H100_STUDY, None, None)  # its trials' stored details
    for m in trials.measured_trials(study, H100_STUDY, captures=False):
        if m.config.method == "ngram":
            recorded[f"h100 trial{m.number}"] = m.ngram_path
    assert len(recorded) >= 20
    assert set(recorded.values()) == {ngram_v2.V1}, recorded


def test_the_replay_on_the_recorded_path_counts_what_it_counted_before_v2() -> None:
    before = json.loads(FIXTURE.read_text())
    now = json.loads(json.dumps(stored.figures(ngram_path=ngram_v2.V1)))
    assert sum(len(v) for v in before.values()) == 48  # launches x (own, baseline) tokens
    assert now == before


def test_the_h100_studys_predictions_say_they_replay_v1(tmp_path: Path) -> None:
    study_dir = tmp_path / "study"
    shutil.copytree(H100_STUDY, study_dir)
    pred = api.predict(study_dir=study_dir, say=lambda *_: None)
    assert pred.ngram_path == ngram_v2.V1
    ngram = [r for r in pred.rows if r.method == "ngram"]
    assert ngram and {r.ngram_path for r in ngram} == {ngram_v2.V1}


def _ngram_path(log: str, method: str) -> str | None:
    """The proposer a stored log extract shows. h200/ngram-study-32p kept only the runner and
    graph lines of each log (no config line, the args line cut), which read_log does not take
    for a vLLM log; there the runner comes from vLLM's own runner lines, as read_log reads them."""
    path = enginepath.read_log(log)
    if path.model_runner is None:
        runner = ("V1" if "using the V1 model runner instead" in log else
                  "V2" if "Using V2 Model Runner" in log else None)
        return enginepath.ngram_path_of({"model_runner": runner} if runner else {}, method)
    return path.ngram_path
