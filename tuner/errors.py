"""Error types: user mistakes (ConfigError, exit 2) versus trial failures (recorded as data).

A ConfigError is raised when a person gave something we cannot use; the CLI prints its
message and exits 2. A TrialFailed is raised when one measurement could not be completed;
the study records it as a FAIL trial with `reason` and `log_tail` and carries on.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A user mistake: the message names the bad value, the valid choices and what to do."""


class TrialFailed(Exception):
    """A trial could not be measured. `kind` is a short machine-readable reason."""

    kind = "failed"

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class EngineCrashed(TrialFailed):
    """The engine process exited before it answered /health (often: vLLM rejected the config)."""

    kind = "engine_crashed"


class EngineStartTimeout(TrialFailed):
    """The engine was alive but never answered /health within the start timeout."""

    kind = "engine_start_timeout"


class EngineDied(TrialFailed):
    """The engine exited while requests were being measured."""

    kind = "engine_died"


class MeasurementFailed(TrialFailed):
    """Too many requests failed, or a concurrency level ran past its timeout."""

    kind = "measurement_failed"
