"""The storage contract: the names under which a study keeps its settings and each trial its
records in Optuna's user attrs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.records.results import PredictionMiss

# Key of a study's "tuner" settings: {level: the line saying that the engine's measured
# acceptance at temperature > 0 does not match the replay} (the replay strategy writes it, the
# recommendation's reason at that level repeats it).
SAMPLING_MISMATCH = "sampling_mismatch"
# Key of a study's "tuner" settings: the PredictionMiss records the replay strategy found
# (dumped), which the recommendation at their level names where it rests on that config.
PREDICTION_MISSES = "prediction_misses"
# Key of a study's "tuner" settings: the RequestSchedule every launch of the study sends.
SCHEDULE = "schedule"


# --- the storage contract: what each trial stores in its Optuna user attrs ----------------------
class TrialAttr:
    """Names of a trial's user attrs in the study's storage; old study folders use the same."""

    CONFIG = "config"  # the TrialConfig as JSON
    CONFIG_KEY = "key"  # TrialConfig.key(): one config, whatever order its fields came in
    LABEL = "label"
    ROLE = "role"  # a Role value
    RESULT = "result"  # the BenchResult as JSON
    FAILURE = "failure"  # a Failure as JSON
    CONSTRAINT = "constraint"  # Optuna's constraint values (<= 0: the SLO is met)
    DUPLICATE_OF = "duplicate_of"  # answered from this earlier trial's storage, no launch
    REPEAT_OF = "repeat_of"
    CONFIG_OVERRIDE = "config_override"  # an enqueued config the sampler does not propose
    WALL_S = "wall_s"
    PHASE = "phase"  # policy campaigns: "ladder" or "verify"
    REPEAT = "repeat"  # policy campaigns: the repeat index
    REPEATS = "repeats"
    # {"file": the tuner.tokens capture, relative to the study folder, "requests": n,
    #  "output_tokens": n (measured requests)}; absent when the engine returned no token ids
    TOKENS = "tokens"


def stored_misses(settings: Mapping[str, Any]) -> list[PredictionMiss]:
    """The PredictionMiss records kept in a study's settings (PREDICTION_MISSES)."""
    return [PredictionMiss.model_validate(m) for m in settings.get(PREDICTION_MISSES) or []]
