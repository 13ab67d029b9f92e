"""decisions.json holds the search's decisions as typed events with their kind; the report
words them (tuner.outputs.decision_words); a file written before the events still renders."""

from __future__ import annotations

import json
import typing

from tuner.outputs import decision_words, decisions
from tuner.records import decisions as ev
from tuner.records.predictions import PredictionMiss


def test_events_are_stored_with_their_kind_and_read_back_as_they_were(tmp_path):
    kept = decisions.Decisions(tmp_path)
    cost = ev.StepCostFit(concurrency=1, a_ms=9.0, b_ms=1.0, points=(
        ev.CostPoint(label="baseline", scored=1.0, mixed=0.0, step_ms=10.0),))
    miss = PredictionMiss(key="k", label="ngram k=3", concurrency=4, predicted=2.0,
                          measured=1.5, error_pct=33.3, accuracy_pct=3.0)
    for event in (ev.SpaceReplayed(configs=185, space="default", requests_per_level=8,
                                   seconds=8.9),
                  cost, ev.PredictionMissed(miss=miss),
                  ev.TrialEnded(done=1, total=2, trial=0, result=None, wall_s=1.0),
                  ev.BudgetSpent(limit="n_trials", n_trials=6, launches=True)):
        kept.add(event)
    entries = json.loads((tmp_path / decisions.DECISIONS_JSON).read_text())["entries"]
    assert [e["kind"] for e in entries] == ["space_replayed", "step_cost", "prediction_miss",
                                            "budget_spent"]  # a progress event is not kept
    assert entries[1]["a_ms"] == 9.0 and entries[2]["miss"]["measured"] == 1.5
    assert decisions.load_events(tmp_path) == kept.events
    # A later fact of the same slot replaces the earlier one, in its place.
    decisions.Decisions(tmp_path).add(cost.model_copy(update={"a_ms": 10.5}))
    again = decisions.load_events(tmp_path)
    assert [e.kind for e in again] == [e["kind"] for e in entries]
    assert again[1].a_ms == 10.5


def test_the_report_words_each_event_as_the_terminal_said_it(tmp_path):
    kept = decisions.Decisions(tmp_path)
    kept.add(ev.Calibration(label="ngram k=7 window 1-2", drafted_per_step=5.04))
    kept.add(ev.Leaders(concurrency=1, leaders=(ev.Leader(
        label="ngram k=7 window 1-2", output_throughput=210.2, speedup=2.01),)))
    kept.add(ev.LaunchFailed(label="ngram k=3", key="k3", leader=True))
    rows = decisions.decision_rows(decisions.load_decisions(tmp_path))
    assert rows == [
        ("Calibration launches", ["ngram k=7 window 1-2 drafts the most per step (5.0 tokens), "
                                  "so the step-cost line spans the space."]),
        ("Predicted leaders", ["At c=1, launched to confirm them: ngram k=7 window 1-2 210.2 "
                               "tok/s (2.01x)."]),
        ("Confirmation", ["ngram k=3 failed; it leaves the confirmation."])]
    said: list[str] = []
    detail: list[str] = []
    narrate = decisions.Narrator(None, say=said.append, detail=detail.append)
    narrate(ev.Calibration(label="ngram k=7 window 1-2", drafted_per_step=5.04))
    narrate(ev.SpaceReplayed(configs=3, space="ngram", requests_per_level=4, seconds=0.2))
    assert said == ["Calibration launch: ngram k=7 window 1-2 drafts the most per step (5.0 "
                    "tokens), so the step-cost line spans the space."]
    assert detail == ["Replayed 3 configs of space 'ngram' over the baseline's 4 requests per "
                      "level in 0.2 s (no engine)."]


def test_a_decisions_json_written_before_the_events_still_renders(tmp_path):
    (tmp_path / decisions.DECISIONS_JSON).write_text(json.dumps({"entries": [
        {"topic": "replay", "key": "", "text": "Replayed 185 configs of space 'default'."},
        {"topic": "step_cost", "key": "c=1", "text": "c=1: step = 9.00 ms"},
        {"kind": "a_newer_kind", "figure": 1},  # a newer tuner's: left out
        {"topic": "newer_topic", "text": "A newer writer's fact."}]}))
    rows = decisions.decision_rows(decisions.load_decisions(tmp_path))
    assert rows == [("Replay of the space", ["Replayed 185 configs of space 'default'."]),
                    ("Step-cost fit (the latest, which priced predicted.csv)",
                     ["c=1: step = 9.00 ms"]),
                    ("newer_topic", ["A newer writer's fact."])]
    # Recording on top of it keeps the old facts and replaces by (topic, key).
    decisions.Decisions(tmp_path).add(ev.StepCostFit(concurrency=1, a_ms=1.0, b_ms=0.5))
    texts = [d.text for d in decisions.load_decisions(tmp_path)]
    assert texts[0] == "Replayed 185 configs of space 'default'."
    assert texts[1].startswith("c=1: step = 1.00 ms + 0.500 ms x tokens scored")


def test_every_kind_decisions_json_stores_has_words_and_a_topic_the_report_names():
    kinds = typing.get_args(typing.get_args(ev.Stored)[0])
    assert set(kinds) <= set(decision_words._TEXT)
    assert {k.topic for k in kinds if k is not ev.Note} <= set(decisions.TOPICS)
