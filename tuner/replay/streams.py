"""Replay stage, token streams: which recorded output a config's engine emits where rounding parts
the recordings.

Speculative decoding is lossless in exact arithmetic only. In bf16 a token's logits, and the
KV entries of the tokens before it, come out slightly different when the engine computes them
in a verify pass of 1 + d tokens than in a one-token decode pass, so now and then a greedy
request takes another token and goes on from there. On the embedded default (CPU build, bf16)
1 of 8 requests did so per level at c=1 on instructcoder and on sharegpt
(benchmarks/data/cpu-replay): every config's output was one of two streams, the baseline's or
the one the calibration config (the launch that drafts the most) emitted, identical in every
repeat. On sharegpt the calibration's stream left a repetition loop that the baseline's
stayed in, so a replay over the baseline's tokens alone put the acceptance length of 8 of 10
configs 6-29% above vLLM's counters at c=1.

Rule 11 of the replay (tuner.replay.acceptance), STREAMS: given the baseline's capture and
one speculative launch's (the alternate), per request whose two outputs part at output
position t, a config follows the stream whose passes it shares: for every output position
before t, whether the engine computed that token's KV in a pass that drafted (the verify step
that fed it, or drafted and accepted it) or in a one-token pass; the baseline's are all
one-token passes, the alternate's and the config's come from their replays (identical tokens
up to t, so the config's replay over the baseline is its replay there). The config follows
the alternate when its shape differs from the alternate's in fewer positions than from the
baseline's, else the baseline (ties included).

Measured (the engine's outputs against the rule, per config and parted request): 17 of 20
right on the stored instructcoder and sharegpt draws (seed 0), 6 of 10 on a fresh sharegpt
draw (seed 1), 10 of 20 on a fresh instructcoder draw (16 prompts, seed 2). Of the 24 cases
whose shape up to t equalled the alternate's, 21 emitted its stream and 3 a third one; every
other miss was a config whose shape matched neither recording, where bf16 rounding does not
follow from pass shapes and the nearest shape is a guess. Acceptance lengths at c=1 against
vLLM's counters, n-gram and suffix: 20 of 20 within 3% on the seed-0 draws (14 of 20 over the
baseline's tokens alone, worst 28.9%), 10 of 10 on fresh sharegpt either way, 9 of 10 on
fresh instructcoder (8 of 10 alone; worst 4.6%, alone 5.0%) (benchmarks/replay_refit.py).
So the rule fixes the large partings (a repetition loop left or kept) and is a coin toss on
the small ones.

Which passes round differently is the machine's: on the box of the stop27 sets (a slower one,
51 ms per baseline step at c=1 where the stop16-25 boxes took 31) the engines' outputs
followed whether a pass scored 5 or more tokens, not whether it drafted at all; the rule as
built picked the emitted stream for 17 of 44 and 10 of 39 parted requests there, counting
passes from 5 tokens would have picked 39 and 29, and on every earlier set passes from 2
tokens (as built) fitted best or tied (benchmarks/stream_widths.py). Two recordings cannot
tell the width, so it is not fitted; a fixed 5 on the stop27 sharegpt set took n-gram
acceptance within 3% from 5/8 to 6/8 but put a suffix config's c=4 TPOT 94% high.

Requests that part only under a config neither recording followed (a third stream) are not
modeled; warm-up requests keep the baseline's stream (their passes are not replayed).
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
