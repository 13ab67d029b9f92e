"""Search stage, the replay strategy's phases: where it stands (`Phase`) and the shape of a
phase as it runs (`Flow`), shared by tuner.search.replay_strategy and its confirm and select
parts.
"""

from __future__ import annotations

from collections.abc import Generator
from enum import Enum
from typing import TypeVar

from optuna.trial import FrozenTrial

from tuner.search.strategy import Launch

# A phase of the strategy as it runs: yields the launches it needs, is sent each one's trial
# (None: it failed), returns what it found.
T = TypeVar("T")
Flow = Generator[Launch, FrozenTrial | None, T]


class Phase(str, Enum):
    """Where the replay strategy stands (ReplaySearch.phase)."""

    BASELINE = "baseline"  # the plain baseline, launched where the study has none
    REPLAY = "replay"  # every candidate predicted over the baseline's tokens
    CALIBRATE = "calibrate"  # the launches that fit the step cost
    CLIMB = "climb"  # the sampled grids searched around the predicted leaders
    CONFIRM = "confirm"  # the baselines and the leaders launched in turn until ranked
    STOPPED = "stopped"  # the Stop handed to the loop says why
