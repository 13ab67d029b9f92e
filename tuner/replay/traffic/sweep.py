"""Replay stage, traffic sweep: every n-gram config of one max n over many requests at once.

vLLM's n-gram function (`_find_longest_matched_ngram_and_propose_tokens`) searches the
context for the latest earlier occurrence of its longest suffix of at most max n tokens; min
n and K never steer that search. min n only refuses a match shorter than itself, and K (with
max-model-len) only cuts how many of the tokens after the match it copies. So one call per
context length with the window (1, max n) and no cut finds the match every config of that max
n would find; the match's length is how far the context before the draft and the context's
end agree (at most max n), and a config's draft is empty where that is shorter than its min n,
else the call's first min(K, context left) tokens (vLLM's own clamp, then the scheduler's trim,
MAX_MODEL_LEN). Each request's walk per config (the rules of tuner.replay.acceptance's compiled
loop: PREFILL_HAS_NO_DRAFT, ADVANCE, NO_MAX_TOKENS_TRIM, PAST_END, COUNTING) reads those cached
matches. Requests run in parallel over the machine's cores. A test holds every count of every
config of the n-gram space equal to `acceptance.replay`'s, which calls vLLM's function per
config and step.

Only stateless n-gram configs with one K (no `num_speculative_tokens_per_batch_size`) take
this path; each request's acceptance is then independent of the others and of the level. Each
chunk's per-request counts also feed tuner.replay.sampling's resamples before they go, so a
config's sampling error over the requests costs no second pass.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.replay import acceptance, sampling

# Per request and config, the counts `Acceptance._count_many` keeps (columns of `stats`).
_STEPS, _DRAFTS, _FULL, _DRAFTED, _ACCEPTED, _CONTINUED, _COULD, _PAST, _WIDTH = range(9)
_COLUMNS = 9


@dataclass(frozen=True)
class Requests:
    """Many requests' token ids, packed: request i is ids[start[i]:start[i] + prompt[i] +
    output[i]], its prompt first."""

    ids: np.ndarray  # int32
    start: np.ndarray  # int64
    prompt: np.ndarray  # int64
    output: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.start)


def sweepable(speculative_config: dict | None) -> bool:
    """An n-gram config with one K: the path this module takes."""
    spec = speculative_config or {}
    return spec.get("method") == "ngram" and not spec.get("num_speculative_tokens_per_batch_size")


@dataclass(frozen=True)
class Swept:
    """One config's acceptance over every request, and its sampling error over them (None
    with fewer than two requests or no draft: tuner.replay.sampling)."""

    acceptance: acceptance.Acceptance
    spread: sampling.Spread | None


def sweep(requests: Requests, max_n: int, configs: Sequence[tuple[int, int]], *,
          max_model_len: int | None) -> dict[tuple[int, int], Swept]:
    """The acceptance of each n-gram config (min n, K) of `configs` with this max n over every
    request (tuner.replay.acceptance.Acceptance, concurrency 1, no per-request lists), with its
    sampling error over the requests. Requests go CHUNK at a time, so the per-request counts
    never outgrow one chunk."""
    pairs = sorted(set(configs))
    table = np.array(pairs, dtype=np.int64).reshape(-1, 2)  # per config: min n, K
    settings = np.array([max_n, acceptance.NO_LIMIT if max_model_len is None
                         else int(max_model_len)], dtype=np.int64)
    total = _Totals(len(pairs), int(table[:, 1].max()))
    for lo in range(0, len(requests), CHUNK):
        part = slice(lo, lo + CHUNK)
        n = len(requests.start[part])
        stats = np.zeros((n, len(pairs), _COLUMNS), dtype=np.int64)
        per_pos = np.zeros((n, len(pairs), total.per_pos.shape[1]), dtype=np.int64)
        _kernel()(requests.ids, requests.start[part], requests.prompt[part],
                  requests.output[part], settings, table, stats, per_pos)
        total.add(stats, per_pos)
        total.resample(stats, requests.output[part], start=lo, n=len(requests))
    return {pair: Swept(acceptance=total.acceptance(j, pair[1], requests),
                        spread=sampling.of_sums(total.resampled[:, j], total.whole[j],
                                                n=len(requests)))
            for j, pair in enumerate(pairs)}


CHUNK = 4096
# The counts of `stats` that make tuner.replay.sampling.PER_REQUEST, its decoded tokens aside.
_PER_REQUEST = [_DRAFTS, _DRAFTED, _ACCEPTED, _STEPS]


class _Totals:
    """Each config's counts summed over the chunks, its requests' draft tokens past the end
    (PAST_END), in request order, and its PER_REQUEST sums in each resample and over all."""

    def __init__(self, configs: int, width: int) -> None:
        self.stats = np.zeros((configs, _COLUMNS), dtype=np.int64)
        self.per_pos = np.zeros((configs, width), dtype=np.int64)
        self.past: list[list[int]] = [[] for _ in range(configs)]
        columns = len(sampling.PER_REQUEST)
        self.resampled = np.zeros((sampling.DRAWS, configs, columns))
        self.whole = np.zeros((configs, columns))

    def add(self, stats: np.ndarray, per_pos: np.ndarray) -> None:
        width = np.maximum(self.stats[:, _WIDTH], stats[:, :, _WIDTH].max(axis=0, initial=0))
        self.stats += stats.sum(axis=0)
        self.stats[:, _WIDTH] = width  # the widest draft, not a sum
        self.per_pos += per_pos.sum(axis=0)
        for j, past in enumerate(stats[:, :, _PAST].T):
            self.past[j] += past[past > 0].tolist()

    def resample(self, stats: np.ndarray, output: np.ndarray, *, start: int, n: int) -> None:
        """Add a chunk's requests (start, start + 1, ... of n) to the resampled sums."""
        per = np.empty((*stats.shape[:2], len(sampling.PER_REQUEST)))
        per[:, :, :-1] = stats[:, :, _PER_REQUEST]
        per[:, :, -1] = np.maximum(output - 1, 0)[:, None]
        self.resampled += sampling.resampled(per, n=n, start=start)
        self.whole += per.sum(axis=0)

    def acceptance(self, j: int, k: int, requests: Requests) -> acceptance.Acceptance:
        """Config j's counts as acceptance.replay counts them."""
        t = self.stats[j]
        return acceptance.Acceptance(
            concurrency=1, requests=len(requests), output_tokens=int(requests.output.sum()),
            steps=int(t[_STEPS]), drafts=int(t[_DRAFTS]), k=k, full_drafts=int(t[_FULL]),
            draft_tokens=int(t[_DRAFTED]), accepted_tokens=int(t[_ACCEPTED]),
            accepted_per_pos=[int(x) for x in self.per_pos[j, :int(t[_WIDTH])]],
            past_end=list(self.past[j]),
            _continued=int(t[_CONTINUED]), _could_continue=int(t[_COULD]))


@functools.cache
def _match():
    """vLLM's n-gram function, compiled into: where its draft for the window (1, max_n)
    starts in `tokens` (-1: no match), the n-gram length it matched, and how many of its first
    `width` tokens the recorded output continues with."""
    import numba

    find = acceptance._ngram_fn()
    anywhere = acceptance.NO_LIMIT

    @numba.njit
    def match(tokens, length, max_n, pos, olen, width):
        d = find(tokens[:length], 1, max_n, anywhere, anywhere)
        if len(d) == 0:
            return -1, 0, 0
        start, n = length - len(d), 0
        while n < max_n and n < start and tokens[start - 1 - n] == tokens[length - 1 - n]:
            n += 1
        m = 0
        while m < width and m < len(d) and pos + m < olen and d[m] == tokens[length + m]:
            m += 1
        return start, n, m

    return match


@functools.cache
def _kernel():
    """The compiled sweep: per request (in parallel), vLLM's match at each context length it
    reaches, found once, then each config's walk over those matches. Compiled once per
    process (about 5 s), never cached on disk: the machine code holds vLLM's function, which
    another vLLM version may change."""
    import numba

    match = _match()

    @numba.njit(parallel=True)
    def run(ids, start, prompt, output, settings, configs, stats, per_pos):
        max_n, max_model_len = settings[0], settings[1]
        width = configs[:, 1].max()
        for r in numba.prange(len(start)):
            plen, olen = prompt[r], output[r]
            tokens = ids[start[r]:start[r] + plen + olen]
            found = np.full((max(olen, 1), 3), -2, np.int64)  # per pos: match(); -2 not yet
            for j in range(len(configs)):
                lo, k, s = configs[j, 0], configs[j, 1], stats[r, j]
                pos = 1  # PREFILL_HAS_NO_DRAFT
                while pos < olen:
                    length = plen + pos
                    n = 0
                    if length < max_model_len:  # MAX_MODEL_LEN
                        if found[pos, 0] == -2:
                            found[pos, 0], found[pos, 1], found[pos, 2] = match(
                                tokens, length, max_n, pos, olen, width)
                        if found[pos, 0] >= 0 and found[pos, 1] >= lo:
                            # vLLM's clamp (K, the context left), then the scheduler's trim
                            n = max(0, min(k, length - found[pos, 0],
                                           max_model_len - length - 1))
                    a = min(found[pos, 2], n) if n else 0  # ADVANCE; NO_MAX_TOKENS_TRIM
                    s[0] += 1
                    if n > 0:  # COUNTING
                        s[1] += 1
                        s[3] += n
                        s[4] += a
                    s[2] += n == k
                    s[8] = max(s[8], n)
                    for i in range(a):
                        per_pos[r, j, i] += 1
                    if a == olen - pos and n > a:  # PAST_END: the last step, censored
                        s[7] = n - a
                    else:
                        s[5] += max(a - 1, 0)
                        s[6] += max(min(a, n - 1), 0)
                    pos = min(olen, pos + a + 1)

    return run
