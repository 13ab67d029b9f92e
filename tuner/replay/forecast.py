"""Replay stage, the forecast: every config's speedup over the workload sample, per level.

The study's first baseline launch also sends the workload sample (RequestSchedule.sample,
tuner.tokens.SAMPLE_LEVEL): prompts no level measures, far more than a launch does. At
temperature 0 their tokens fix what every n-gram and suffix config drafts and accepts on them
(tuner.replay.acceptance), so each config's drafts are played out at each level on the step
cost the launches fitted (tuner.replay.calibration.calibrate), beside the baseline's play of the
same requests. Each request's share of the played engine time is kept (Schedule.share_ms):
the speedup over any resample of the sample's prompts is the ratio of the summed shares, so
the bootstrap over prompts is one matrix product, paired (one draw of prompts for every
config). No engine, no words: tuner.analysis.selection decides on these figures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.records.configs import EngineLimits, TrialConfig
from tuner.replay import acceptance, cost, schedule
from tuner.replay.yardstick import play
from tuner.tokens import RequestTokens, TokenCapture

DRAWS = 2000  # bootstrap resamples of the sample's prompts
# The replay's acceptance is per request and does not depend on the level (temperature 0):
# the sample is replayed once, as this level, and played out at every level of the study.
_REPLAYED_AS = 1


@dataclass(frozen=True)
class LevelForecast:
    """Every config's play of the workload sample at one level, beside the baseline's."""

    concurrency: int
    keys: tuple[str, ...]  # config keys, in the row order of `share_ms`
    labels: tuple[str, ...]
    base_share_ms: np.ndarray  # (requests,): the baseline's share of each request
    share_ms: np.ndarray  # (configs, requests)
    # The plain baseline's throughput over the one the step cost is anchored on (1 where the
    # engine path does not change; tuner.replay.yardstick.Yardstick.path_ratio).
    path_ratio: float = 1.0

    @property
    def requests(self) -> int:
        return int(self.base_share_ms.shape[0])

    def log_speedups(self, counts: np.ndarray | None = None) -> np.ndarray:
        """log(speedup over the plain baseline) of every config: over the whole sample
        (`counts` None, shape (configs,)), or over each resample whose prompt counts are the
        rows of `counts` (shape (configs, draws))."""
        if counts is None:
            base, mine = self.base_share_ms.sum(), self.share_ms.sum(axis=1)
        else:
            base, mine = counts @ self.base_share_ms, self.share_ms @ counts.T
        return np.log(base) - np.log(mine) - np.log(self.path_ratio)

    def index(self, key: str) -> int:
        return self.keys.index(key)


@dataclass(frozen=True)
class Forecast:
    """The workload sample's forecast at every level, and the resamples drawn for it."""

    levels: dict[int, LevelForecast]
    counts: np.ndarray  # (draws, requests): how often each prompt is in each resample
    seconds: float
    skipped: tuple[str, ...] = ()  # configs the replay could not run on the sample, why

    @property
    def requests(self) -> int:
        return int(self.counts.shape[1])


def sample_capture(capture: TokenCapture) -> TokenCapture | None:
    """The workload sample of a baseline's capture as a capture of its own (None: it has no
    sample), its requests in the order they were sent."""
    sample = capture.sample()
    if not sample:
        return None
    return TokenCapture(requests=tuple(dataclasses.replace(r, concurrency=_REPLAYED_AS)
                                       for r in sample))


def forecast(sample: TokenCapture, configs: Sequence[TrialConfig],
             costs: Mapping[int, cost.StepCost], *, limits: EngineLimits,
             ngram_path: str | None = None, path_ratio: Mapping[int, float] | None = None,
             memo: dict | None = None, seed: int = 0) -> Forecast | None:
    """Every replayable speculative config of `configs` played over `sample` (sample_capture)
    at every level `costs` prices with a calibrated step cost; None where none is calibrated
    or the sample is empty. `memo` carries replays between calls (a config's acceptance on the
    sample never changes)."""
    t0 = time.monotonic()
    max_model_len, max_num_seqs = limits.max_model_len, limits.max_num_seqs
    requests: list[RequestTokens] = sorted(sample.level(_REPLAYED_AS, warmup=False),
                                           key=lambda r: r.index)
    priced = {c: step for c, step in costs.items() if step.calibrated}
    if not requests or not priced:
        return None
    lengths = [len(r.output) for r in requests]
    prompts = [len(r.prompt) for r in requests]
    memo = {} if memo is None else memo
    replayed: dict[str, acceptance.Acceptance] = {}
    skipped: list[str] = []
    kept: list[TrialConfig] = []
    for cfg in configs:
        if not cfg.speculative_config or not acceptance.replayable(cfg):
            continue
        key = (cfg.key(), sample.digest, max_model_len, max_num_seqs, ngram_path)
        try:
            if key not in memo:
                memo[key] = acceptance.replay(sample, cfg, max_model_len=max_model_len,
                                              max_num_seqs=max_num_seqs,
                                              levels=[_REPLAYED_AS],
                                              ngram_path=ngram_path)[_REPLAYED_AS]
        except ValueError as e:
            skipped.append(f"{cfg.label()}: {e}")
            continue
        replayed[cfg.key()] = memo[key]
        kept.append(cfg)
    levels: dict[int, LevelForecast] = {}
    for c, step in sorted(priced.items()):
        slots = min(c, max_num_seqs)
        base = play(step, schedule.baseline_drafts(lengths), lengths, prompts, k=0, slots=slots)
        rows = []
        for cfg in kept:
            acc = replayed[cfg.key()]
            rows.append(play(step, acc.request_drafts, acc.request_lengths, prompts, k=acc.k,
                             slots=slots).share_ms)
        levels[c] = LevelForecast(
            concurrency=c, keys=tuple(cfg.key() for cfg in kept),
            labels=tuple(cfg.label() for cfg in kept),
            base_share_ms=np.asarray(base.share_ms, dtype=float),
            share_ms=np.asarray(rows, dtype=float).reshape(len(kept), len(requests)),
            path_ratio=float((path_ratio or {}).get(c) or 1.0))
    return Forecast(levels=levels, counts=resample_counts(len(requests), draws=DRAWS, seed=seed),
                    seconds=time.monotonic() - t0, skipped=tuple(skipped))


def resample_counts(n: int, *, draws: int, seed: int) -> np.ndarray:
    """(draws, n): how often each of n prompts is drawn in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=draws).astype(float)
