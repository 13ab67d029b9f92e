"""Replay stage, traffic: a user's own request logs replayed over every config of a space, no
engine.

capture (the logs -> token ids, tokenized as vLLM's OpenAI server does) -> each config
replayed over them at each level, as a closed loop of c requests in file order (n-gram
configs with one K by tuner.replay.traffic.sweep, every config of one max n in one pass; the rest by
tuner.replay.acceptance) -> per config and level: acceptance rate, acceptance length, drafted
tokens per step. With a study on the target hardware (tuner.replay.traffic.price), also
predicted throughput, TPOT and speedup over the plain baseline. Unless every request says
temperature 0, each figure carries the half-width of a 90% interval over the requests it was
computed from (tuner.replay.sampling's bootstrap; the sweep's per-request counts feed it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.records.configs import TrialConfig
from tuner.records.predictions import TrafficRow
from tuner.replay import acceptance, sampling
from tuner.replay.traffic import price, sweep
from tuner.replay.traffic.capture import Traffic, read
from tuner.tokens import TokenCapture

__all__ = ["Traffic", "TrafficPrediction", "predict", "read"]


@dataclass
class TrafficPrediction:
    """The replayed table of one traffic file, and what went into it."""

    rows: list[TrafficRow]
    traffic: Traffic
    levels: list[int]
    configs: int
    seconds: float
    skipped: list[str] = field(default_factory=list)  # configs that could not be replayed, why
    study: str | None = None  # the study that priced it
    priced_levels: list[int] = field(default_factory=list)

    def notes(self) -> list[str]:
        """What a person should know about the table, a line each."""
        t = self.traffic
        out = [f"{len(t)} requests replayed from {t.path}"
               + (f" ({t.model})" if t.model else "") + "."]
        if t.skipped:
            out.append(f"Skipped {sum(t.skipped.values())} records: " + "; ".join(
                f"{n} {why}" for why, n in t.skipped.most_common()) + ".")
        out.append(_answers_note(t))
        if t.sampled:
            out.append(f"{t.sampled} requests were sampled at temperature > 0: the replay over "
                       f"their recorded tokens holds in expectation (docs/method.md, "
                       f"Sampling).")
        out.append(self._pm_note())
        if self.study is not None:
            rest = [c for c in self.levels if c not in self.priced_levels]
            out.append(f"Throughput, TPOT and speedup: the step cost of {self.study}"
                       + (f" at c={','.join(map(str, self.priced_levels))}"
                          if self.priced_levels else " (no level it can price)")
                       + (f"; c={','.join(map(str, rest))} not measured there, acceptance "
                          f"only" if rest and self.priced_levels else "") + ".")
        out += [f"Not replayed: {why}" for why in self.skipped]
        return out

    def _pm_note(self) -> str:
        t = self.traffic
        if t.greedy_only:
            return ("Every request says temperature 0: the replay of these requests is exact "
                    "(no ±).")
        n = len(price.sample_rows(len(t)))
        played = (f"; throughput and TPOT over the {n} requests played"
                  if self.priced_levels and n < len(t) else "")
        return (f"Each ± is the half-width of a 90% interval for a run of as many requests "
                f"like these, from resampling them{played} (docs/method.md, Your own "
                f"traffic).")


def predict(traffic: Traffic, configs: Sequence[TrialConfig], *, levels: Sequence[int],
            max_model_len: int | None, max_num_seqs: int,
            calibration: price.Calibration | None = None) -> TrafficPrediction:
    """Every replayable config of `configs` over `traffic` at each level (a closed loop of c);
    priced on `calibration` (a study's step cost) where it covers the level; with
    sampling.PM_COLUMNS unless every request says temperature 0."""
    t0 = time.monotonic()
    todo = [cfg for cfg in configs if acceptance.replayable(cfg)]
    skipped = [f"{cfg.label()}: method {cfg.method} is not replayable"
               for cfg in configs if cfg.method != "none" and cfg not in todo]
    found = _sweep(traffic, [c for c in todo if _sweepable(c)], max_model_len=max_model_len)
    rows: list[TrafficRow] = []
    pricer = _Pricer(traffic, calibration, max_model_len=max_model_len,
                     max_num_seqs=max_num_seqs)
    failed: set[str] = set()
    for c in levels:
        base = _row(TrialConfig(), c, None, pricer.baseline(c))
        rows.append(base)
        for cfg in todo:
            if cfg.key() in failed:
                continue
            try:
                swept = found.get(cfg.key()) or _replay(traffic, cfg, c, max_model_len,
                                                        max_num_seqs)
            except ValueError as e:  # a config vLLM's proposer cannot run (acceptance.replay)
                skipped.append(f"{cfg.label()}: {e}")
                failed.add(cfg.key())
                continue
            priced, played = pricer.config(cfg, c, base)
            row = _row(cfg, c, dataclasses.replace(swept.acceptance, concurrency=c), priced)
            rows.append(sampling.with_half_widths(row, _spread(traffic, swept, played)))
    return TrafficPrediction(
        rows=rows, traffic=traffic, levels=list(levels), configs=len(todo) - len(failed),
        seconds=time.monotonic() - t0, skipped=list(dict.fromkeys(skipped)),
        study=calibration.study if calibration else None,
        priced_levels=[c for c in levels if pricer.level(c) is not None])


def _sweepable(cfg: TrialConfig) -> bool:
    return sweep.sweepable(cfg.speculative_config)


def _sweep(traffic: Traffic, configs: Sequence[TrialConfig], *,
           max_model_len: int | None) -> dict[str, sweep.Swept]:
    """The n-gram configs with one K, a max n at a time (tuner.replay.traffic.sweep)."""
    groups: dict[int, dict[tuple[int, int], list[TrialConfig]]] = {}
    for cfg in configs:
        lo, hi = acceptance.window(cfg)
        groups.setdefault(hi, {}).setdefault((lo, cfg.k), []).append(cfg)
    out = {}
    for hi, by_pair in groups.items():
        found = sweep.sweep(traffic.requests, hi, list(by_pair), max_model_len=max_model_len)
        out.update({cfg.key(): found[pair] for pair, cfgs in by_pair.items() for cfg in cfgs})
    return out


def _replay(traffic: Traffic, cfg: TrialConfig, c: int, max_model_len: int | None,
            max_num_seqs: int) -> sweep.Swept:
    """A config the sweep does not cover, by tuner.replay.acceptance over the whole traffic."""
    acc = acceptance.replay(traffic.capture(c), cfg,
                            max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                            levels=[c])[c]
    return sweep.Swept(acceptance=acc,
                       spread=None if traffic.greedy_only else sampling.spread(acc))


def _spread(traffic: Traffic, swept: sweep.Swept, played: acceptance.Acceptance | None
            ) -> sampling.Spread | None:
    """A row's sampling error: acceptance's over every request, throughput's and TPOT's over
    the played ones (`played`: the config's replay over them, where the level is priced);
    none where every request says temperature 0."""
    if traffic.greedy_only or swept.spread is None:
        return None
    over_played = sampling.spread(played) if played is not None else None
    return dataclasses.replace(swept.spread, tokens_per_step_rel=(
        over_played.tokens_per_step_rel if over_played is not None else math.nan))


class _Pricer:
    """The predicted figures of each row where a study prices the level; none otherwise."""

    def __init__(self, traffic: Traffic, cal: price.Calibration | None, *,
                 max_model_len: int | None, max_num_seqs: int) -> None:
        self.traffic, self.cal = traffic, cal
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self.rows = price.sample_rows(len(traffic))
        self._levels: dict[int, price.Level | None] = {}
        self._samples: dict[int, TokenCapture] = {}

    def sample(self, c: int) -> TokenCapture:
        """The played requests as level c of a token capture (tuner.replay.traffic.price)."""
        if c not in self._samples:
            self._samples[c] = self.traffic.capture(c, self.rows)
        return self._samples[c]

    def level(self, c: int) -> price.Level | None:
        if self.cal is None:
            return None
        if c not in self._levels:
            self._levels[c] = price.level(self.cal, c)
        return self._levels[c]

    def baseline(self, c: int) -> price.Priced:
        lv = self.level(c)
        if lv is None:
            return price.Priced()
        return price.baseline(lv, self.sample(c), c)

    def config(self, cfg: TrialConfig, c: int, base: TrafficRow
               ) -> tuple[price.Priced, acceptance.Acceptance | None]:
        """The config's predicted figures, and its replay over the played requests (None
        where the level is not priced)."""
        lv = self.level(c)
        if lv is None:
            return price.Priced(), None
        sample = self.sample(c)
        acc = acceptance.replay(sample, cfg, max_model_len=self.max_model_len,
                                max_num_seqs=self.max_num_seqs, levels=[c])[c]
        return price.config(lv, sample, c, acc, base.pred_output_throughput), acc


def _row(cfg: TrialConfig, c: int, acc: acceptance.Acceptance | None,
         priced: price.Priced) -> TrafficRow:
    """A config's row at level c: its replayed acceptance (none for the baseline) and its
    predicted figures; no half-widths yet (sampling.with_half_widths)."""
    spec = cfg.speculative_config
    row = TrafficRow(key=cfg.key(), label=cfg.label(), method=cfg.method,
                     speculative_config=json.dumps(spec, sort_keys=True) if spec else "",
                     concurrency=c, pred_output_throughput=priced.output_throughput,
                     pred_mean_tpot_ms=priced.mean_tpot_ms,
                     pred_mean_ttft_ms=priced.mean_ttft_ms, pred_speedup=priced.speedup)
    if acc is None:
        return row
    return dataclasses.replace(
        row, acceptance_rate=acc.acceptance_rate, acceptance_length=acc.acceptance_length,
        drafted_per_step=acc.drafted_per_step, tokens_per_step=acc.tokens_per_step,
        per_position=json.dumps([round(x, 4) for x in acc.per_position]),
        num_drafts=acc.drafts, num_draft_tokens=acc.draft_tokens,
        num_accepted_tokens=acc.counted_accepted)


def _answers_note(t: Traffic) -> str:
    if t.answers_checked:
        return (f"Answers: {t.answers_differ} of {t.answers_checked} given both as text and as "
                f"the engine's ids re-tokenize to other ids than the engine emitted; the ids "
                f"were replayed.")
    if t.answers_unchecked:
        return (f"Answers: {t.answers_unchecked} given both as text and as ids could not be "
                f"checked against each other (no tokenizer); the ids were replayed.")
    if t.text_answers:
        return (f"Answers: {t.text_answers} given as text only, tokenized with the model's "
                f"tokenizer; whether the engine emitted those ids could not be checked (a "
                f"model may emit other ids for the same text).")
    return "Answers: the ids the engine emitted, replayed as they are."
