"""The orchestrator: each command is a straight list of stage calls taking one options record.

options -> engine resolved, inputs checked -> workload -> search space -> trial config ->
engine -> load -> metrics -> storage -> analysis -> outputs. The stages (measure, search,
analysis, outputs) never call each other's steps in sequence; only tuner.api does. Each
command first resolves its options record (the user's engine into an EngineSpec, the defaults
that follow from it) and checks it (tuner.checks), before anything is printed or created;
what each function returns is a record or a path the CLI prints.

This module is the table of the commands' entry points, each in the module of its concern:
the engine and the workload (engines), a model-based method's drafter (drafters), `tuner
bench` (measurement), `tuner optimize` (optimization), the load-aware policy
(policy_pipeline), `tuner report` and `recommend` (study_outputs), `tuner verify`
(verification), `tuner predict` (prediction), `tuner repair` and the one writer of a study
(journal). The CLI makes exactly one call of this table per command.
"""

from __future__ import annotations

from tuner.api.journal import repair
from tuner.api.measurement import bench
from tuner.api.optimization import optimize, optimize_and_report, resolve_optimize
from tuner.api.policy_pipeline import policy
from tuner.api.prediction import predict, predict_traffic
from tuner.api.study_outputs import recommend, report, write_report
from tuner.api.verification import verify

__all__ = ["bench", "live_engines", "names", "optimize", "optimize_and_report", "policy",
           "predict", "predict_traffic", "recommend", "repair", "report", "resolve_optimize",
           "verify", "write_report"]


def names() -> dict[str, tuple[str, ...]]:
    """The valid names `--help` lists where the value is checked later (with a message that
    says what to do) rather than by argparse's `choices`: spaces, samplers, objectives."""
    from tuner.measure.metrics import OBJECTIVES
    from tuner.search.samplers import SAMPLERS
    from tuner.search.space import available

    return {"spaces": tuple(available()), "samplers": tuple(SAMPLERS),
            "objectives": tuple(OBJECTIVES)}


def live_engines() -> list[int]:
    """The process groups of this process's engines still running (tuner.measure.engine)."""
    from tuner.measure import engine

    return list(engine.live_engines())
