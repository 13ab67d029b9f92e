"""Outputs stage, how the search decided: decisions.json in the study folder and the report's
"How it was decided" section. The search records each fact as it goes (the replay of the space,
the calibration launches, the engine path, the step-cost fit, the token streams, the grid
climb, the predicted leaders, the confirmation's verdict, why it stopped) as typed events
(tuner.records.decisions); the terminal shows most of them with -v only, and `tuner report`
words them (tuner.outputs.decision_words) from this file."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.outputs import decision_words as words
from tuner.outputs import files
from tuner.records import decisions as ev

DECISIONS_JSON = "decisions.json"
# The section's order; a topic's facts keep the order they were first recorded in.
TOPICS = {
    "strategy": "Strategy",
    "replay": "Replay of the space",
    "calibration": "Calibration launches",
    "engine_path": "Engine path",
    "climb": "Grid climb",
    "step_cost": "Step-cost fit (the latest, which priced predicted.csv)",
    "streams": "Token streams",
    "leaders": "Predicted leaders",
    "confirmation": "Confirmation",
    "selection": "Each level decided on the workload sample (the latest)",
    "forecast_miss": "Launches that missed the forecast",
    "sampling": "Sampling (temperature > 0)",
    "prediction_miss": "Predictions that missed their measurement",
    "stop": "Why the search stopped",
}
INTRO = ("What the search did and why, recorded as it ran (tuner optimize -v prints it too). "
         "With a workload sample each level is decided on the replay's forecast over it, its "
         "choice launched to confirm it; without one, predictions only decide what to launch "
         "and recommendations come from measured trials.")


@dataclass(frozen=True)
class Decision:
    """One recorded fact as the report shows it: its topic (a TOPICS key, or a newer
    writer's), the key it is kept under within the topic ("" for a topic's one fact) and its
    text (tuner.outputs.decision_words)."""

    topic: str
    key: str
    text: str


class Decisions:
    """The decisions of one study folder, kept in decisions.json as typed events
    (tuner.records.decisions, each with its kind): one per (topic, slot), a later record
    replacing an earlier one, so a resumed study updates what it decides again and keeps
    what it does not (a calibration launched by the first run)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / DECISIONS_JSON
        self.events = load_events(out_dir)

    def add(self, event: ev.Event) -> None:
        """Keep `event` (a progress event, of no topic, is not kept)."""
        topic = ev.topic_of(event)
        if topic is None:
            return
        at = next((i for i, e in enumerate(self.events)
                   if (ev.topic_of(e), e.slot()) == (topic, event.slot())), None)
        if at is not None and self.events[at] == event:
            return
        if at is None:
            self.events.append(event)
        else:
            self.events[at] = event
        self.path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(self.path, json.dumps(
            {"entries": [ev.dump_event(e) for e in self.events]}, indent=1) + "\n")

    def record(self, topic: str, text: str, key: str = "") -> None:
        """Keep a fact outputs worded itself (a Note)."""
        self.add(ev.Note(topic=topic, key=key, text=text))


class Narrator:
    """Where the search's events go: their progress lines to `say` and (-v) `detail`, the
    decisions into the study folder's decisions.json. Called as `tell(event, store=True,
    show=True)`: `show` False keeps it without a line, `store` False prints it only."""

    def __init__(self, out_dir: Path | None, *, say: Callable[[str], None],
                 detail: Callable[[str], None] | None = None,
                 trial_line: Callable[..., str] | None = None) -> None:
        self.decisions = Decisions(out_dir) if out_dir is not None else None
        self.say, self.detail, self.trial_line = say, detail, trial_line

    def __call__(self, event: ev.Event, *, store: bool = True, show: bool = True) -> None:
        if show:
            for level, line in words.lines(event, trial_line=self.trial_line):
                if level == words.Level.SAY:
                    self.say(line)
                elif self.detail is not None:
                    self.detail(line)
        if store and self.decisions is not None:
            self.decisions.add(event)

    def note(self, topic: str, text: str, key: str = "") -> None:
        """Keep a fact outputs worded itself (tuner.outputs.ranking)."""
        if self.decisions is not None:
            self.decisions.record(topic, text, key)


def load_events(out_dir: Path) -> list[ev.Event]:
    """The recorded decisions of `out_dir`, or none where there is no readable decisions.json
    (a study of an older tuner, or one whose search recorded nothing); an entry written
    before the events (topic, key, text) reads as a Note, one this tuner cannot read (a newer
    writer's kind) is left out."""
    try:
        doc = json.loads((Path(out_dir) / DECISIONS_JSON).read_text())
    except (OSError, ValueError):
        return []
    entries = doc.get("entries") if isinstance(doc, dict) else None
    out = []
    for entry in entries or []:
        if not isinstance(entry, dict):
            continue
        try:
            out.append(ev.load_event(entry))
        except ValueError:
            continue
    return out


def load_decisions(out_dir: Path) -> list[Decision]:
    """The recorded decisions of `out_dir` in words, in the order they were first recorded."""
    return [Decision(topic=str(ev.topic_of(e)), key=e.slot(), text=words.text(e))
            for e in load_events(out_dir)]


def decision_rows(entries: list[Decision]) -> list[tuple[str, list[str]]]:
    """The section's rows, (title, texts), in TOPICS order; a topic no tuner names (a newer
    writer's) comes last under its own name."""
    order = [*TOPICS, *dict.fromkeys(e.topic for e in entries if e.topic not in TOPICS)]
    rows = []
    for topic in order:
        texts = [e.text for e in entries if e.topic == topic]
        if texts:
            rows.append((TOPICS.get(topic, topic), texts))
    return rows
