"""Replay stage, the replays a prediction reads: each config's acceptance per level over one
capture, replayed once per (config, capture) and kept in the caller's memo, and, where the
baseline's tokens part from what drafting engines emit (bf16 rounding), over the stream each
request follows (tuner.replay.streams).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tuner.records.configs import TrialConfig
from tuner.replay import acceptance, ngram_v2, streams
from tuner.replay.measured import MeasuredTrial
from tuner.tokens import TokenCapture


class Replayer:
    """Replays configs over one capture, once per (config, capture); with an alternate
    stream (tuner.replay.streams), over the stream each request of the config follows."""

    def __init__(self, capture: TokenCapture, *, max_model_len: int | None, max_num_seqs: int,
                 levels: Sequence[int], memo: dict | None = None,
                 ngram_path: str | None = None) -> None:
        self.capture, self.levels = capture, list(levels)
        self.ngram_path = ngram_path  # the n-gram proposer the engine runs; None: not known
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self._memo: dict[tuple, dict[int, acceptance.Acceptance]] = {} if memo is None else memo
        self.alternate: streams.Alternate | None = None
        self.switched: dict[str, int] = {}  # config key -> requests on the alternate's stream

    @functools.cached_property
    def partings(self) -> dict[tuple[int, int], int]:
        return self.alternate.partings(self.capture) if self.alternate else {}

    def acceptance(self, cfg: TrialConfig, *, capture: TokenCapture | None = None
                   ) -> dict[int, acceptance.Acceptance]:
        """The config's acceptance per level: over `capture` (a launch's own tokens) when
        given, else over the baseline's tokens, each request on the stream it follows."""
        own = self._replay(cfg, capture or self.capture)
        if capture is not None or self.alternate is None:
            return own
        followed, switched = streams.follow(self.capture, own, self.alternate, self.partings)
        self.switched[cfg.key()] = switched
        return own if not switched else self._replay(cfg, followed)

    def _replay(self, cfg: TrialConfig, cap: TokenCapture) -> dict[int, acceptance.Acceptance]:
        memo_key = (cfg.key(), cap.digest, tuple(self.levels), self.max_model_len,
                    self.max_num_seqs, self.ngram_path or ngram_v2.V1)  # None replays V1
        if memo_key not in self._memo:
            self._memo[memo_key] = acceptance.replay(
                cap, cfg, max_model_len=self.max_model_len,
                max_num_seqs=self.max_num_seqs, levels=self.levels, ngram_path=self.ngram_path)
        return self._memo[memo_key]

    def prompt_lengths(self, c: int) -> list[int]:
        return level_prompt_lengths(self.capture, c)


def alternate_stream(replay: Replayer, measured: Sequence[MeasuredTrial]
                     ) -> streams.Alternate | None:
    """STREAMS: the measured speculative launch whose tokens stand for what drafting engines
    emit where the baseline's part from them: the first calibration launch (the config that
    drafts the most), else the first measured replayable speculative launch with tokens."""
    spec = [m for m in measured if m.speculative and m.capture is not None
            and acceptance.replayable(m.config)]
    if not spec:
        return None
    pick = min(spec, key=lambda m: (m.role != "calibration", m.number))
    try:
        replayed = replay.acceptance(pick.config, capture=pick.capture)
    except ValueError:
        return None
    return streams.Alternate(capture=pick.capture, replayed=replayed, label=pick.config.label())


def streams_line(replay: Replayer) -> str:
    """One line on STREAMS for the console: how many measured requests of the alternate
    launch part from the baseline's, and how many configs follow it there."""
    if replay.alternate is None or not replay.partings:
        return ""
    requests = sum(1 for c in replay.levels for r in replay.capture.level(c, warmup=False))
    following = sum(1 for n in replay.switched.values() if n)
    return (f"token streams: {len(replay.partings)} of {requests} measured requests part from "
            f"the baseline's under {replay.alternate.label}; {following} of "
            f"{len(replay.switched)} configs follow that stream there (their drafting passes "
            "match it: tuner.replay.streams)")


def level_output_lengths(capture: TokenCapture, c: int) -> list[int]:
    """The output lengths of the capture's measured requests at level c, in index order."""
    return [len(r.output) for r in sorted(capture.level(c, warmup=False), key=lambda r: r.index)]


def level_prompt_lengths(capture: TokenCapture, c: int) -> list[int]:
    """The prompt lengths of the capture's measured requests at level c, in index order."""
    return [len(r.prompt) for r in sorted(capture.level(c, warmup=False), key=lambda r: r.index)]
