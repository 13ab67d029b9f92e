"""Analysis stage, what every answer at one concurrency level carries: the level, its SLOs, the
study's settings and the launches behind its speedup interval (LevelContext), and the
Recommendation it builds with the serve command, the same flags as a `vllm serve --config`
mapping (serve_config, the model named as the user gave it) and the verify commands.
tuner.analysis.recommend decides which answer a level gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from tuner import engine_cmdline, intervals
from tuner.analysis.noise import UNMEASURED_NOISE
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.records.predictions import PredictionMiss
from tuner.records.recommendations import Recommendation, Status, Verdict
from tuner.records.storage import StudySettings


@dataclass(frozen=True)
class LevelContext:
    """What every answer at one level carries: the level, its SLOs, the study's settings."""

    concurrency: int
    slos: dict[str, float | None]
    # The study's settings (model, workload, decision rule, what the replay found); None where
    # the frame comes without a study (tests, a frame built by hand).
    settings: StudySettings | None = None
    # The spread taken for a speculative config measured once (noise.single_run_spread).
    single_run_spread: float = UNMEASURED_NOISE
    # config key -> TrialConfig (frame.configs_of): the records behind the rows.
    configs: Mapping[str, TrialConfig] = field(default_factory=dict)
    # config key -> each launch's throughput at this level (frame.launch_throughputs), their
    # between-launch spread pooled (tuner.intervals), and the plain baseline's key.
    runs: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    pool: intervals.Pool = field(default_factory=intervals.Pool)
    base_key: str = ""
    # config key -> each launch's windows at this level (frame.launch_windows): the paired
    # within-level spread each interval adds (tuner.intervals.Within).
    windows: Mapping[str, tuple[intervals.LaunchWindows, ...]] = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        """The study's --confidence (a fraction), stored with its settings."""
        stored = self.settings.confidence if self.settings else None
        return intervals.CONFIDENCE if stored is None else float(stored)

    @property
    def margin(self) -> float:
        """The study's --margin (a fraction): within it of 1.00x is no difference."""
        stored = self.settings.margin if self.settings else None
        return intervals.MARGIN if stored is None else float(stored)

    def interval(self, row: pd.Series) -> intervals.Interval | None:
        """The row's speedup over the plain baseline across launches, with its interval."""
        within = intervals.Within.paired(self.windows.get(row["config_key"], ()),
                                         self.windows.get(self.base_key, ()))
        return intervals.speedup(self.runs.get(row["config_key"], ()),
                                 self.runs.get(self.base_key, ()), pool=self.pool,
                                 confidence=self.confidence, within=within)

    def decision(self, row: pd.Series) -> intervals.Decision | None:
        """What the row's interval says against 1.00x (intervals.decide); None without one."""
        iv = self.interval(row)
        return None if iv is None else intervals.decide(iv, self.margin)

    def answer(self, status: Status, verdict: Verdict, *, serving: TrialConfig | None = None,
               **extra: Any) -> Recommendation:
        """The Recommendation: `verdict` with what the level knows, its interval's figures,
        and where `serving` names the config to serve, its serve command, the same as a `vllm
        serve --config` mapping and the note beside them (tuner.engine_cmdline.serve_note)."""
        iv = verdict.interval
        if serving is not None:
            s = self.settings
            extra.update(
                serve_command=engine_cmdline.serve_command(_shown_engine(s), serving),
                serve_config=serve_config(s, serving),
                serve_note=engine_cmdline.serve_note(s.engine_spec if s else None))
        figures: dict[str, Any] = dict(
            speedup_interval=None if iv is None else (iv.lo, iv.hi),
            confidence_level=None if iv is None else iv.confidence,
            equivalence_margin=None if iv is None else iv.margin,
            launches=None if iv is None else iv.launches)
        return Recommendation(
            concurrency=self.concurrency, status=status, slos=self.slos,
            verdict=verdict.model_copy(update={
                "sampling_mismatch": self.sampling_mismatch,
                "slos_set": any(v is not None for v in self.slos.values())}),
            **{**figures, **extra})

    @property
    def sampling_mismatch(self) -> str | None:
        """The line where the engine's measured acceptance at this level did not match the
        replay at temperature > 0 (StudySettings.sampling_mismatch, written by the replay
        strategy)."""
        return self.settings.sampling_mismatch.get(str(self.concurrency)) \
            if self.settings else None

    def misses(self, row: pd.Series) -> tuple[PredictionMiss, ...]:
        """The replay's misses of the row's config at this level (StudySettings.prediction_misses, written
        by the replay strategy): a recommendation resting on it says so."""
        found = self.settings.misses_at(self.concurrency) if self.settings else ()
        return tuple(m for m in found if m.key == row["config_key"])

    def config(self, row: pd.Series) -> TrialConfig:
        return self.configs[row["config_key"]]

    def verify(self, config: TrialConfig) -> str:
        s = self.settings
        return engine_cmdline.verify_command(
            engine=s.engine_spec if s else None, workload=s.workload if s else None,
            config=config, concurrency=self.concurrency, settings=s.settings if s else None)

    def verify_against_baseline(self, config: TrialConfig) -> str:
        """The baseline's verify line, then `config`'s: a "leave speculation off" verdict is
        checked by re-measuring the best speculative config beside the baseline, now."""
        return f"{self.verify(TrialConfig())} && {self.verify(config)}"



def _shown_engine(settings: StudySettings | None) -> EngineSpec:
    """The study's engine with the model as the user named it (the resolved path stays in the
    fingerprint); a study stored before names were kept shows its path."""
    spec = settings.engine_spec if settings else EngineSpec(model="MODEL")
    return spec.model_copy(update={"model": spec.model_name or spec.model})


def serve_config(settings: StudySettings | None, config: TrialConfig) -> dict[str, Any]:
    """The serve command as the mapping `vllm serve --config FILE.yaml` reads: each option's
    name without its dashes, the speculative config as a mapping, a flag as true (`--no-x`
    as `x: false`), JSON values as mappings. A short flag the mapping cannot name is kept
    under its own spelling, so nothing measured is dropped silently."""
    import yaml

    spec = _shown_engine(settings)
    out: dict[str, Any] = {"model": spec.model}
    if config.speculative_config:
        out["speculative-config"] = dict(config.speculative_config)
    argv = engine_cmdline.engine_flags(config) + list(spec.extra_args)
    for flag in engine_cmdline.parse_flags(argv):
        if flag.value is None:
            if flag.name.startswith("no-"):
                out[flag.name[3:]] = False
            else:
                out[flag.name] = True
            continue
        try:  # "4096" -> 4096, '{"a": 1}' -> {"a": 1}; "4k" stays text, as vLLM reads it
            parsed = yaml.safe_load(flag.value)
        except yaml.YAMLError:
            parsed = flag.value
        out[flag.name] = parsed if isinstance(parsed, (int, float, dict, list)) and not \
            isinstance(parsed, bool) else flag.value
    return out
