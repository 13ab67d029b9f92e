"""Outputs stage, how the search decided: decisions.json in the study folder and the report's
"How it was decided" section. The search records each fact as it goes (the replay of the space,
the calibration launches, the engine path, the step-cost fit, the token streams, the grid
climb, the predicted leaders, the confirmation's verdict, why it stopped); the terminal shows
most of them with -v only, and `tuner report` renders them from this file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.outputs import files

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
    """One recorded fact: its topic (a TOPICS key, or a newer writer's), the key it is kept
    under within the topic ("" for a topic's one fact) and its text."""

    topic: str
    key: str
    text: str


class Decisions:
    """The facts of one study folder, kept in decisions.json: one text per (topic, key), a
    later record replacing an earlier one, so a resumed study updates what it decides again
    and keeps what it does not (a calibration launched by the first run)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / DECISIONS_JSON
        self.entries = load_decisions(out_dir)

    def record(self, topic: str, text: str, key: str = "") -> None:
        entry = Decision(topic=topic, key=key, text=text)
        at = next((i for i, e in enumerate(self.entries)
                   if (e.topic, e.key) == (topic, key)), None)
        if at is not None and self.entries[at] == entry:
            return
        if at is None:
            self.entries.append(entry)
        else:
            self.entries[at] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(self.path, json.dumps(
            {"entries": [asdict(e) for e in self.entries]}, indent=1) + "\n")


def load_decisions(out_dir: Path) -> list[Decision]:
    """The recorded facts of `out_dir`, or none where there is no readable decisions.json (a
    study of an older tuner, or one whose search recorded nothing)."""
    try:
        doc = json.loads((Path(out_dir) / DECISIONS_JSON).read_text())
    except (OSError, ValueError):
        return []
    entries = doc.get("entries") if isinstance(doc, dict) else None
    return [Decision(topic=str(e["topic"]), key=str(e.get("key") or ""), text=str(e["text"]))
            for e in entries or [] if isinstance(e, dict) and "topic" in e and "text" in e]


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
