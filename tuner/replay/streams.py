"""Replay stage, token streams: which recorded output a config's engine emits where bf16 rounding
parts the recordings.

In bf16 a token computed in a verify pass of 1 + d tokens can round differently than in a
one-token pass, so a greedy request under speculation can leave the baseline's stream. Given the
baseline's capture and one speculative launch's (the alternate, the calibration launch), per
request whose two outputs part at output position t, a config follows the stream whose pass
shape it shares: for each position before t, whether that token was computed in a pass that
scored at least `width` tokens (1 + its draft; `pass_shape`) or in a one-token pass. The config
follows the alternate when its shape differs from the alternate's in fewer positions than from
the baseline's, else the baseline (ties included; `nearer_alternate`).

Which pass width parts the outputs depends on the machine, and two recordings cannot tell it,
so it is fixed (DRAFTING_WIDTH = 2: any drafting pass); benchmarks/stream_widths.py counts
how often each width would have picked the emitted stream on the stored sets. A third stream is not
modeled; warm-up requests keep the baseline's stream. docs/method.md describes the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.replay.acceptance import Acceptance
from tuner.tokens import RequestTokens, TokenCapture


@dataclass(frozen=True)
class Alternate:
    """A speculative launch's own capture and its config's replay over it (per level)."""

    capture: TokenCapture
    replayed: dict[int, Acceptance]
    label: str = ""

    def partings(self, base: TokenCapture) -> dict[tuple[int, int], int]:
        """(level, index) -> the output position where this capture's measured request parts
        from the baseline's (same prompt; requests with other prompts are left out)."""
        mine = {(r.concurrency, r.index): r for r in self.capture.requests if not r.warmup}
        out = {}
        for r in base.requests:
            alt = mine.get((r.concurrency, r.index))
            if r.warmup or alt is None or not np.array_equal(r.prompt, alt.prompt):
                continue
            if (t := parting(r.output, alt.output)) is not None:
                out[(r.concurrency, r.index)] = t
        return out


def parting(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first output position where two streams differ (None: identical)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    if len(differ):
        return int(differ[0])
    return None if len(a) == len(b) else n


DRAFTING_WIDTH = 2  # a pass counts as drafting from this many tokens scored (it drafted at all)


def pass_shape(drafted: np.ndarray, accepted: np.ndarray, upto: int, *,
               width: int = DRAFTING_WIDTH) -> np.ndarray:
    """For output positions 0..upto-1: True where the token's KV was computed in a pass that
    drafted, i.e. scored at least `width` tokens (1 + its draft). The verify step that starts
    with p tokens emitted feeds token p-1 and its draft, and keeps the accepted draft tokens
    p..p+a-1 (PREFILL_HAS_NO_DRAFT: the first step starts at p = 1)."""
    shape = np.zeros(upto, dtype=bool)
    p = 1
    for d, a in zip(drafted.tolist(), accepted.tolist(), strict=True):
        if p - 1 >= upto:
            break
        shape[p - 1:min(p + a, upto)] = d > 0 and 1 + d >= width
        p += a + 1
    return shape


def follow(base: TokenCapture, replayed: dict[int, Acceptance], alternate: Alternate,
           partings: dict[tuple[int, int], int]) -> tuple[TokenCapture, int]:
    """The capture a config's engine would have emitted (STREAMS), given the config's replay
    over the baseline; and how many requests took the alternate's stream."""
    if not partings:
        return base, 0
    alt = {(r.concurrency, r.index): r for r in alternate.capture.requests if not r.warmup}
    switched = 0
    out: list[RequestTokens] = []
    for r in base.requests:
        t = None if r.warmup else partings.get((r.concurrency, r.index))
        if t is not None and _follows_alternate(r, t, replayed, alternate):
            out.append(alt[(r.concurrency, r.index)])
            switched += 1
        else:
            out.append(r)
    return (TokenCapture(requests=tuple(out)) if switched else base), switched


def _follows_alternate(req: RequestTokens, t: int, replayed: dict[int, Acceptance],
                       alternate: Alternate) -> bool:
    mine = _shape(replayed.get(req.concurrency), req, t)
    theirs = _shape(alternate.replayed.get(req.concurrency), req, t)
    if mine is None or theirs is None:
        return False
    return nearer_alternate(mine, theirs)


def nearer_alternate(mine: np.ndarray, theirs: np.ndarray) -> bool:
    """The rule's choice from two pass shapes up to the parting: the config's is nearer the
    alternate's than the baseline's (all one-token passes) in Hamming distance; ties go to the
    baseline."""
    return int((mine != theirs).sum()) < int(mine.sum())


def _shape(acc: Acceptance | None, req: RequestTokens, t: int) -> np.ndarray | None:
    """The pass shape of `req` in a replay (request_* lists are in index order)."""
    if acc is None or not acc.request_accepted:
        return None
    order = acc.request_order
    if req.index not in order:
        return None
    i = order[req.index]
    return pass_shape(acc.request_drafts[i], acc.request_accepted[i], t)
