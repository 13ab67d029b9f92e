"""Replay stage, acceptance: vLLM's own n-gram and suffix proposers stepped over recorded tokens.

At temperature 0 speculative decoding is lossless, so a recorded baseline (tuner.tokens) fixes
what every step of an n-gram or suffix config drafts and accepts. This module steps the
installed vLLM's proposer code over those tokens (imported, never re-implemented): for n-gram
the function `NgramProposer.propose` calls per request, for suffix vLLM's
`SuffixDecodingProposer` fed one engine step at a time, as the model runner feeds it. That
n-gram proposer is the V1 model runner's; the V2 runner's is a Triton scan that needs a GPU, so
its rule is written out (tuner.replay.ngram_v2, tested against vLLM's kernels) and stepped the
same way where the caller says the engine takes that path (`ngram_path`).

`replay(capture, config, ...)` returns per config the drafted and accepted counts as vLLM's
spec-decode counters count them, per-position rates, and each request's draft lengths (which
tuner.replay.schedule plays out). The engine rules it models are named in the code where they
apply: PREFILL_HAS_NO_DRAFT, ADVANCE, MAX_MODEL_LEN, NO_MAX_TOKENS_TRIM (with PAST_END),
COUNTING, BATCH_SCHEDULE, SYNC_PATH, CLOSED_LOOP, SUFFIX_LAST_STEP, UNIFORM_DECODE and STREAMS
(tuner.replay.streams); docs/method.md describes each. Not modeled: chunked prefill of prompts
longer than the step's token budget.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner.records.configs import TrialConfig
from tuner.replay import ngram_v2
from tuner.speculative.proposer_settings import ProposerSettings
from tuner.speculative.schedule_rules import varying_k
from tuner.tokens import RequestTokens, TokenCapture

REPLAYABLE = ("ngram", "suffix")
# MAX_MODEL_LEN: an engine without a --max-model-len runs to the model's own context, which is
# not known here: no limit (vLLM's ngram function takes an int).
NO_LIMIT = 1 << 30


@dataclass
class Acceptance:
    """What one config drafts and accepts over the measured requests of one level."""

    concurrency: int
    requests: int = 0
    output_tokens: int = 0
    steps: int = 0  # decode steps after prefill, every request summed
    drafts: int = 0  # steps that drafted at least one token (vLLM's num_drafts)
    k: int = 0  # the config's num_speculative_tokens: a uniform step scores 1 + k per request
    full_drafts: int = 0  # UNIFORM_DECODE: verify steps whose draft was exactly k tokens
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    request_steps: list[int] = field(default_factory=list)  # per measured request, in index order
    # per measured request, in index order: the draft length of each of its verify steps (what
    # the schedule simulation prices, tuner.replay.schedule)
    request_drafts: list[np.ndarray] = field(default_factory=list, repr=False)
    # ... and how many of those draft tokens it accepted (where each step's tokens came from a
    # pass that drafted: tuner.replay.streams), and its output length
    request_accepted: list[np.ndarray] = field(default_factory=list, repr=False)
    request_lengths: list[int] = field(default_factory=list, repr=False)
    request_indices: list[int] = field(default_factory=list, repr=False)
    # PAST_END: per last step that matched every remaining token, its draft tokens past the end
    past_end: list[int] = field(default_factory=list)
    _continued: int = 0  # accepted positions i+1 whose position i was accepted
    _could_continue: int = 0  # accepted positions i followed by a drafted position i+1
    # replay(trace=True): per request index, every verify step's (drafted, accepted)
    trace: dict[int, list[tuple[int, int]]] | None = None
    ngram_path: str | None = None  # n-gram: the proposer replayed, ngram_v2.V1 | V2

    @property
    def request_order(self) -> dict[int, int]:
        """A request's index -> its position in the request_* lists."""
        return {index: i for i, index in enumerate(self.request_indices)}

    @property
    def continuation_rate(self) -> float:
        """rho: how often a drafted position i+1 was accepted when position i was, over every
        step that ended inside the recording (PAST_END)."""
        return self._continued / self._could_continue if self._could_continue else 0.0

    @property
    def expected_past_end(self) -> float:
        """PAST_END: draft tokens past a request's end that vLLM's counters would accept."""
        rho = self.continuation_rate
        return sum(sum(rho ** j for j in range(1, m + 1)) for m in self.past_end)

    @property
    def counted_accepted(self) -> float:
        """Accepted tokens as vLLM's counter counts them (past-end acceptance included)."""
        return self.accepted_tokens + self.expected_past_end

    @property
    def acceptance_rate(self) -> float | None:
        return self.counted_accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def acceptance_length(self) -> float | None:
        return 1.0 + self.counted_accepted / self.drafts if self.drafts else None

    @property
    def per_position(self) -> list[float]:
        return [a / self.drafts for a in self.accepted_per_pos] if self.drafts else []

    @property
    def drafted_per_step(self) -> float:
        """Mean draft tokens a request adds to a step: the extra work verification scores."""
        return self.draft_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per decode step of a request (1 without speculation)."""
        decode_tokens = self.output_tokens - self.requests  # the prefill emits one each
        return decode_tokens / self.steps if self.steps else 1.0

    @property
    def uniform_share(self) -> float:
        """UNIFORM_DECODE: the share of this level's batched decode steps in which every
        request scores 1 + k tokens (1.0 without speculation or without steps)."""
        if not self.steps or not self.k:
            return 1.0
        return (self.full_drafts / self.steps) ** max(1, self.concurrency)

    def summary(self) -> AcceptanceSummary:
        return AcceptanceSummary(
            concurrency=self.concurrency, requests=self.requests,
            output_tokens=self.output_tokens, steps=self.steps, num_drafts=self.drafts,
            num_draft_tokens=self.draft_tokens, num_accepted_tokens=self.accepted_tokens,
            expected_past_end_accepted=self.expected_past_end,
            acceptance_rate=self.acceptance_rate, acceptance_length=self.acceptance_length,
            per_position=tuple(self.per_position), drafted_per_step=self.drafted_per_step,
            tokens_per_step=self.tokens_per_step, full_drafts=self.full_drafts,
            uniform_share=self.uniform_share)

    def _count_many(self, drafted: np.ndarray, accepted: np.ndarray, *,
                    censored_last: bool = False) -> None:
        """_count for many steps at once (the last one past the end when `censored_last`)."""
        seen = slice(0, len(drafted) - 1 if censored_last else len(drafted))
        self._continued += int(np.maximum(accepted[seen] - 1, 0).sum())
        self._could_continue += int(np.minimum(accepted[seen], drafted[seen] - 1).clip(0).sum())
        self.steps += len(drafted)
        has = drafted > 0
        self.drafts += int(has.sum())
        self.full_drafts += int((drafted == self.k).sum()) if self.k else 0
        self.draft_tokens += int(drafted.sum())
        self.accepted_tokens += int(accepted[has].sum())
        width = int(drafted.max(initial=0))
        if len(self.accepted_per_pos) < width:
            self.accepted_per_pos.extend([0] * (width - len(self.accepted_per_pos)))
        for i in range(int(accepted.max(initial=0))):
            self.accepted_per_pos[i] += int((accepted > i).sum())

    def _count(self, drafted: int, accepted: int, *, censored: bool = False) -> None:
        if not censored:
            self._continued += max(accepted - 1, 0)
            self._could_continue += max(min(accepted, drafted - 1), 0)
        self.steps += 1
        if drafted:  # COUNTING
            self.drafts += 1
            self.full_drafts += int(drafted == self.k)
            self.draft_tokens += drafted
            self.accepted_tokens += accepted
            if len(self.accepted_per_pos) < drafted:
                self.accepted_per_pos.extend([0] * (drafted - len(self.accepted_per_pos)))
            for i in range(accepted):
                self.accepted_per_pos[i] += 1


@dataclass(frozen=True)
class AcceptanceSummary:
    """An Acceptance's figures, with vLLM's counter names where it has one: two replays that
    agree here counted every step alike."""

    concurrency: int
    requests: int
    output_tokens: int
    steps: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    expected_past_end_accepted: float
    acceptance_rate: float | None
    acceptance_length: float | None
    per_position: tuple[float, ...]
    drafted_per_step: float
    tokens_per_step: float
    full_drafts: int
    uniform_share: float


def replayable(config: TrialConfig) -> bool:
    return config.method in REPLAYABLE


def replay(capture: TokenCapture, config: TrialConfig, *,
           max_model_len: int | None = None, max_num_seqs: int | None = None,
           levels: Iterable[int] | None = None, trace: bool = False,
           ngram_path: str | None = None) -> dict[int, Acceptance]:
    """Acceptance of `config` at each level of `capture` (measured requests only);
    with `trace`, also every step of every request (Acceptance.trace). `max_model_len` and
    `max_num_seqs` are the engine's (EngineLimits): max_model_len None is no limit;
    max_num_seqs bounds a K schedule (num_speculative_tokens_per_batch_size), which needs it.
    `ngram_path`: the n-gram proposer the engine runs (ngram_v2.PATHS); None, not known, steps
    V1's, as every replay did before V2 was modeled (the caller says it was not known).

    Raises ValueError for a method the replay cannot run (see REPLAYABLE), and for a config
    without the K vLLM would need (an n-gram config names num_speculative_tokens)."""
    method = config.method
    if method not in REPLAYABLE:
        raise ValueError(f"method {method!r} cannot be replayed; replayable: {REPLAYABLE}")
    wanted = set(capture.levels() if levels is None else levels)
    settings = ProposerSettings.of(config)
    k = settings.k
    if not k:
        raise ValueError(f"a {method} config needs num_speculative_tokens")
    max_model_len = NO_LIMIT if max_model_len is None else max_model_len
    if ngram_path is not None and ngram_path not in ngram_v2.PATHS:
        raise ValueError(f"unknown n-gram path {ngram_path!r}; known: {ngram_v2.PATHS}")
    k_schedule = settings.k_schedule
    rule = varying_k(method, runner="V1")  # the proposers replayed are V1's
    if k_schedule and not rule.accepted:
        # tuner.speculative.schedule_rules.varying_k: suffix's proposer asserts K never changes.
        raise ValueError(f"{method} with num_speculative_tokens_per_batch_size: vLLM's "
                         f"proposer accepts no per-batch-size K ({rule.why})")
    lookup = _schedule(k_schedule, max_num_seqs=max_num_seqs, k=k)
    if method == "ngram":
        lo, hi = settings.window
        proposer: _Proposer = _Ngram(k=k, min_n=lo, max_n=hi, max_model_len=max_model_len,
                                     path=ngram_path or ngram_v2.V1)
        if lookup is None:  # stateless and one K: every request on its own is exact
            return {c: _independent(capture.level(c, warmup=False), proposer, c, trace)
                    for c in capture.levels() if c in wanted}
    else:
        proposer = _Suffix(settings, k=k, max_model_len=max_model_len)
    out = {}
    for c in capture.levels():  # CLOSED_LOOP: every level, so a suffix cache sees it all
        for warmup in (True, False):
            stats = _closed_loop(capture.level(c, warmup=warmup), proposer, c, lookup, trace)
            if not warmup and c in wanted:
                out[c] = stats
    return out


# -- configs ------------------------------------------------------------------------------------
def window(config: TrialConfig) -> tuple[int, int]:
    """The n-gram window (min n, max n) `config` drafts with, as vLLM resolves it."""
    settings = ProposerSettings.of(config)
    if settings is None:
        raise ValueError("a config without speculation has no n-gram window")
    return settings.window


def _schedule(spec_schedule: tuple[tuple[int, int, int], ...], *, max_num_seqs: int | None,
              k: int) -> list[int] | None:
    if not spec_schedule:
        return None
    if max_num_seqs is None:
        raise ValueError("a K schedule (num_speculative_tokens_per_batch_size) needs the "
                         "engine's max_num_seqs (EngineLimits.max_num_seqs)")
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return build_dynamic_sd_schedule_lookup(list(spec_schedule), max_num_seqs, k)


# -- proposers ----------------------------------------------------------------------------------
class _Running:
    """One request in flight: where it is in its recorded output, and its pending draft."""

    __slots__ = ("req", "rid", "tokens", "pos", "draft", "last", "past")

    def __init__(self, req: RequestTokens, rid: str) -> None:
        self.req, self.rid = req, rid
        self.tokens = np.concatenate([req.prompt, req.output]).astype(np.int32)
        self.pos = 0  # output tokens emitted so far
        self.draft = np.zeros(0, np.int32)
        self.last: list[int] = []  # ids emitted by the last step (the suffix cache's input)
        self.past = 0  # PAST_END: draft tokens of the last verify step past the recorded end

    @property
    def context_len(self) -> int:
        return len(self.req.prompt) + self.pos


class _Proposer:
    def propose(self, batch: Sequence[_Running], k: int) -> None:
        raise NotImplementedError


@functools.cache
def _ngram_fn():
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens,
    )

    return _find_longest_matched_ngram_and_propose_tokens


class _Ngram(_Proposer):
    """V1: vLLM's numba function as it is; V2: the Triton scan's rule (ngram_v2.find, the same
    signature), which fills every one of the step's K slots."""

    def __init__(self, *, k: int, min_n: int, max_n: int, max_model_len: int,
                 path: str = ngram_v2.V1) -> None:
        self.k, self.min_n, self.max_n, self.max_model_len = k, min_n, max_n, max_model_len
        self.path = path
        self.find = _ngram_fn() if path == ngram_v2.V1 else ngram_v2.find()

    @property
    def settings(self) -> tuple[int, int, int, int]:
        """What the compiled kernel reads: (min_n, max_n, max_model_len, k)."""
        return self.min_n, self.max_n, self.max_model_len, self.k

    def propose(self, batch: Sequence[_Running], k: int) -> None:
        for r in batch:
            r.draft = self.draft(r.tokens, r.context_len, k)

    def draft(self, tokens: np.ndarray, length: int, k: int) -> np.ndarray:
        # MAX_MODEL_LEN: V1's propose skips the request; V2 drafts, and the trim below drops it
        if length >= self.max_model_len or k <= 0:
            return tokens[:0]
        d = self.find(tokens[:length], self.min_n, self.max_n, self.max_model_len, min(k, self.k))
        return d[:max(0, self.max_model_len - length - 1)]  # MAX_MODEL_LEN: scheduler trim


class _Suffix(_Proposer):
    """vLLM's SuffixDecodingProposer, with the few fields of its configs and input batch it
    reads given as plain namespaces (it runs without a GPU)."""

    def __init__(self, settings: ProposerSettings, *, k: int, max_model_len: int) -> None:
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        sc = types.SimpleNamespace(
            suffix_decoding_max_tree_depth=settings.suffix_max_tree_depth,
            suffix_decoding_max_cached_requests=settings.suffix_max_cached_requests,
            suffix_decoding_max_spec_factor=settings.suffix_max_spec_factor,
            suffix_decoding_min_token_prob=settings.suffix_min_token_prob,
            num_speculative_tokens=k)
        config = types.SimpleNamespace(
            speculative_config=sc,
            model_config=types.SimpleNamespace(max_model_len=max_model_len))
        self.proposer = SuffixDecodingProposer(config)
        self.k, self.max_model_len = k, max_model_len

    def propose(self, batch: Sequence[_Running], k: int) -> None:
        width = max((len(r.tokens) for r in batch), default=1)
        token_ids = np.zeros((max(len(batch), 1), width), dtype=np.int32)
        for i, r in enumerate(batch):
            token_ids[i, :len(r.tokens)] = r.tokens
        input_batch = types.SimpleNamespace(
            req_ids=[r.rid for r in batch],
            req_id_to_index={r.rid: i for i, r in enumerate(batch)},
            num_prompt_tokens=[len(r.req.prompt) for r in batch],
            num_tokens_no_spec=[r.context_len for r in batch],
            token_ids_cpu=token_ids)
        drafts = self.proposer.propose(self.k, input_batch, [r.last for r in batch])
        for r, d in zip(batch, drafts, strict=True):
            r.draft = np.asarray(d, dtype=np.int32)


# -- stepping -----------------------------------------------------------------------------------
def _verify(r: _Running) -> tuple[int, int]:
    """ADVANCE: (drafted, accepted) of this step; moves `r` past accepted + bonus."""
    out = r.req.output
    start = r.pos
    drafted = len(r.draft)
    target = out[start:start + drafted]
    matches = r.draft[:len(target)] == target  # NO_MAX_TOKENS_TRIM: past the end is rejected
    accepted = int(np.argmin(np.append(matches, False)))
    remaining = len(out) - start
    r.past = drafted - remaining if accepted == remaining and drafted > remaining else 0
    r.pos = min(len(out), start + accepted + 1)
    r.last = out[start:r.pos].tolist()
    return drafted, accepted


def _independent(reqs: list[RequestTokens], proposer: _Ngram, c: int,
                 trace: bool) -> Acceptance:
    """Each request on its own, every step inside one compiled loop around vLLM's function."""
    stats = Acceptance(concurrency=c, k=proposer.k, trace={} if trace else None,
                       ngram_path=proposer.path)
    kernel = _ngram_kernel(proposer.path)
    for req in sorted(reqs, key=lambda q: q.index):
        tokens = np.concatenate([req.prompt, req.output]).astype(np.int32)
        drafted = np.zeros(max(1, len(req.output)), np.int64)
        accepted = np.zeros_like(drafted)
        past = np.zeros(1, np.int64)
        steps = kernel(tokens, len(req.prompt), len(req.output), proposer.settings, drafted,
                       accepted, past)
        if past[0]:
            stats.past_end.append(int(past[0]))
        stats._count_many(drafted[:steps], accepted[:steps], censored_last=bool(past[0]))
        if trace:
            stats.trace[req.index] = list(zip(drafted[:steps].tolist(),
                                               accepted[:steps].tolist(), strict=True))
        stats.requests += 1
        stats.output_tokens += len(req.output)
        stats.request_steps.append(int(steps))
        stats.request_drafts.append(drafted[:steps].astype(np.int16))
        stats.request_accepted.append(accepted[:steps].astype(np.int16))
        stats.request_lengths.append(len(req.output))
        stats.request_indices.append(req.index)
    return stats


@functools.cache
def _ngram_kernel(path: str = ngram_v2.V1):
    """One request's whole replay as a numba function that calls vLLM's jitted proposer
    function (V2: the scan's rule, ngram_v2.find) step by step: the same rules as _Ngram.draft
    and _verify (a test holds the two paths equal), about 100x faster than stepping in Python."""
    import numba

    find = _ngram_fn() if path == ngram_v2.V1 else ngram_v2.find()

    @numba.njit
    def run(tokens, plen, olen, settings, drafted, accepted, past):
        min_n, max_n, max_model_len, k = settings  # _Ngram.settings
        pos, steps = 1, 0  # PREFILL_HAS_NO_DRAFT
        while pos < olen:
            length = plen + pos
            n, a = 0, 0
            if length < max_model_len:  # MAX_MODEL_LEN
                d = find(tokens[:length], min_n, max_n, max_model_len, k)
                n = min(len(d), max(0, max_model_len - length - 1))
                # ADVANCE; NO_MAX_TOKENS_TRIM: a draft past the recorded end is rejected
                while a < n and pos + a < olen and d[a] == tokens[length + a]:
                    a += 1
            drafted[steps], accepted[steps] = n, a
            if a == olen - pos and n > a:  # PAST_END
                past[0] = n - a
            steps += 1
            pos = min(olen, pos + a + 1)
        return steps

    return run


_ids = iter(range(1 << 62))


def _closed_loop(reqs: list[RequestTokens], proposer: _Proposer, c: int,
                 lookup: list[int] | None, trace: bool) -> Acceptance:
    """CLOSED_LOOP: step the requests `c` at a time; returns their acceptance."""
    stats = Acceptance(concurrency=c, k=proposer.k, trace={} if trace else None,
                       ngram_path=getattr(proposer, "path", None))
    queue = sorted(reqs, key=lambda q: q.index)[::-1]
    running: list[_Running] = []
    steps_of: dict[int, int] = {}
    drafts_of: dict[int, list[int]] = {}
    accepted_of: dict[int, list[int]] = {}
    k_next = proposer.k if lookup is None else lookup[min(c, len(lookup) - 1)]
    while queue or running:
        batch: list[_Running] = []
        for r in running:  # verify last step's drafts
            step = _verify(r)
            stats._count(*step, censored=r.past > 0)
            if r.past:
                stats.past_end.append(r.past)
            if trace:
                stats.trace.setdefault(r.req.index, []).append(step)
            steps_of[id(r.req)] = steps_of.get(id(r.req), 0) + 1
            drafts_of.setdefault(id(r.req), []).append(step[0])
            accepted_of.setdefault(id(r.req), []).append(step[1])
            batch.append(r)
        while queue and len(batch) < c:  # PREFILL_HAS_NO_DRAFT: new requests emit one token
            r = _Running(queue.pop(), f"r{next(_ids)}")
            r.pos, r.last = 1, r.req.output[:1].tolist()
            steps_of[id(r.req)] = 0
            batch.append(r)
        # SUFFIX_LAST_STEP: finished requests are in this step's batch too.
        proposer.propose(batch, k_next)
        if lookup is not None:  # BATCH_SCHEDULE
            k_next = lookup[min(len(batch), len(lookup) - 1)]
        running = [r for r in batch if r.pos < len(r.req.output)]
        for r in batch:
            if r.pos >= len(r.req.output):
                stats.requests += 1
                stats.output_tokens += len(r.req.output)
    ordered = sorted(reqs, key=lambda q: q.index)
    stats.request_steps = [steps_of[id(q)] for q in ordered]
    stats.request_drafts = [np.array(drafts_of.get(id(q), []), dtype=np.int16) for q in ordered]
    stats.request_accepted = [np.array(accepted_of.get(id(q), []), dtype=np.int16)
                              for q in ordered]
    stats.request_lengths = [len(q.output) for q in ordered]
    stats.request_indices = [q.index for q in ordered]
    return stats
