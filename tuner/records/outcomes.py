"""Records, outcomes: what a command hands the command line once it is done (the study's
outputs and recommendations, the traffic prediction's table). They gather the records of
results, policy and predictions, so they live apart from each."""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict

from tuner.records.configs import Frozen
from tuner.records.policy import PolicyDocument
from tuner.records.predictions import TrafficRow
from tuner.records.recommendations import Recommendation


class TrafficOutcome(Frozen):
    """What `tuner predict --traffic` hands the CLI: the table, the notes beside it, the rows
    (for --json) and the files written."""

    table: str
    notes: tuple[str, ...] = ()
    rows: tuple[TrafficRow, ...] = ()
    paths: dict[str, Path] = {}
    requests: int = 0
    configs: int = 0
    seconds: float = 0.0


class StudyOutcome(Frozen):
    """What `tuner optimize` hands the CLI: where the study is, whether it has anything to
    compare (`failed`: the one line saying why not), the outputs and recommendations."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    study_name: str
    out_dir: Path
    failed: str | None = None
    paths: dict[str, Path] = {}
    recommendations: tuple[Recommendation, ...] = ()
    policy: PolicyDocument | None = None


class RepairedLine(Frozen):
    """A bad line of a journal: its number, why it was bad (tuner.search.storage's reading of
    it) and whether a whole record glued to it was kept (`salvaged`)."""

    line: int
    why: str = ""
    salvaged: bool = False


class JournalRepair(Frozen):
    """What `tuner repair` did to a study's journal: the records kept, the bad lines moved into
    the quarantine file beside it, and the studies it loads (name, trials) afterwards."""

    journal: Path
    kept: int
    lines: tuple[RepairedLine, ...] = ()
    quarantine: str = ""
    studies: tuple[tuple[str, int], ...] = ()
