"""Search stage, Optuna's samplers and the objectives they optimize: which samplers a study
may use (SAMPLERS), each built with its seed and, for a constrained study, the SLO
constraints stored per trial (tuner.search.study.constraint_values).
"""

from __future__ import annotations

from typing import Any

from tuner.errors import ConfigError
from tuner.measure.metrics import OBJECTIVES
from tuner.search import study as st

SAMPLERS = ("tpe", "nsga2", "gp", "random", "grid")


def validate_objectives(names: list[str]) -> list[str]:
    for n in names:
        if n not in OBJECTIVES:
            raise ConfigError(f"Unknown objective '{n}'. Available: {', '.join(OBJECTIVES)}. "
                              f"Example: --objectives output_throughput,mean_tpot_ms.")
    if len(set(names)) != len(names) or not names:
        raise ConfigError(f"--objectives must list distinct names, got {names}.")
    return names


def quiet_optuna() -> None:
    """Our own one line per trial replaces Optuna's INFO lines and experimental warnings
    (for scripts; the CLI sets Optuna's verbosity from -q/-v once, in tuner.cli.main)."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def make_sampler(name: str, *, seed: int | None, constrained: bool) -> Any:
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    cons = st.constraint_values if constrained else None
    # Optuna 5 deprecates constraints_func (a FutureWarning per run) for Trial.set_constraint,
    # which Optuna 4, still allowed by pyproject, lacks: the portable form stays, unwarned.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*constraints_func")
        return _sampler(name, seed=seed, cons=cons)


def _sampler(name: str, *, seed: int | None, cons: Any) -> Any:
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                          constraints_func=cons, n_startup_trials=5)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, constraints_func=cons, population_size=8)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, constraints_func=cons)
    if name in ("random", "grid"):  # grid: every point is enqueued by the driver
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"Unknown sampler '{name}'. Available: {', '.join(SAMPLERS)}.")
