"""Search stage, the load-aware policy's K curves: for a chosen config, the predicted speedup
of every K at each ladder level, replayed over the ladder baseline's tokens on a step cost
fitted to the ladder's measured runs (tuner.replay.predict). tuner.api calls it when it builds
the policy.
"""

from __future__ import annotations

from pathlib import Path

from tuner.measure import enginepath
from tuner.records.configs import EngineLimits, TrialConfig
from tuner.records.policy import LadderRun
from tuner.records.trials import Role
from tuner.replay import acceptance
from tuner.replay.measured import MeasuredTrial
from tuner.replay.predict import predict
from tuner.tokens import TokenCapture


def ladder_predictions(ladder_runs: list[LadderRun], chosen: TrialConfig, *, study_dir: Path,
                       limits: EngineLimits, k_max: int | None = None,
                       temperature: float = 0.0) -> dict[int, dict[int, float]] | None:
    """The load-aware policy's predicted curves: for every K from 1 to k_max (default: the
    chosen config's K) of `chosen`, the predicted speedup over the baseline at each ladder
    level, from the ladder baseline's tokens and a step cost fitted on the ladder's measured
    speculative runs, at the study's sampling `temperature` (as tuner.replay.predict takes
    it). None when the method cannot be replayed or no baseline run has tokens.
    Returns {K: {concurrency: predicted speedup}}."""
    if not acceptance.replayable(chosen) or chosen.engine_args:
        return None
    measured, base_capture = _ladder_measured(ladder_runs, study_dir)
    if base_capture is None:
        return None
    configs = [chosen.with_k(k) for k in range(1, (k_max or chosen.k or 1) + 1)]
    pred = predict(base_capture, configs, measured, max_model_len=limits.max_model_len,
                   max_num_seqs=limits.max_num_seqs, temperature=temperature)
    k_of = {cfg.key(): cfg.k for cfg in configs}
    out: dict[int, dict[int, float]] = {}
    for row in pred.rows:
        k = k_of.get(row.key)
        if k is not None and row.pred_speedup is not None:
            out.setdefault(k, {})[row.concurrency] = float(row.pred_speedup)
    return out or None


def _ladder_measured(ladder_runs: list[LadderRun], study_dir: Path
                     ) -> tuple[list[MeasuredTrial], TokenCapture | None]:
    """The ladder's measured runs as the predictor takes them (numbered by their place in
    `ladder_runs`), and the first baseline run's token capture."""
    measured, base_capture = [], None
    for i, run in enumerate(ladder_runs):
        result = run.result
        if result is None:
            continue
        capture = _run_capture(run, study_dir)
        role = "baseline" if not result.config.speculative_config else "search"
        if run.role == Role.ALIGNED_BASELINE.value:
            role = Role.ALIGNED_BASELINE.value  # anchors the step cost on the speculative path
        if role == "baseline" and base_capture is None:
            base_capture = capture
        measured.append(MeasuredTrial(number=i, config=result.config, role=role,
                                      levels={lv.concurrency: lv for lv in result.levels},
                                      capture=capture, ngram_path=enginepath.ngram_path_of(
                                          result.engine.details, result.config.method)))
    return measured, base_capture


def _run_capture(run: LadderRun, study_dir: Path) -> TokenCapture | None:
    """A ladder run's token capture, or None when it has none or its file cannot be read."""
    if run.tokens is None:
        return None
    try:
        return TokenCapture.load(study_dir / run.tokens.file)
    except (OSError, ValueError, KeyError):
        return None
