"""Replay stage, the n-gram proposer of vLLM's V2 model runner: its Triton scan's rule on the CPU.

vLLM has two n-gram proposers. The V1 model runner calls the numba function of
vllm/v1/spec_decode/ngram_proposer.py, which tuner.replay.acceptance imports and steps as it is.
The V2 model runner (vLLM's GPU default in 0.3x; vLLM 0.26 falls back to V1 for n-gram) builds
NgramGPUSpeculator for both `ngram` and `ngram_gpu` (vllm/v1/worker/gpu/spec_decode/__init__.py
:79-84), two Triton kernels (vllm/v1/worker/gpu/spec_decode/ngram/speculator.py) that need a
GPU. So its rule is written out here, from vLLM 0.32.0's kernels line by line, and
tests/unit/test_replay_ngram_v2.py runs vLLM's own kernels in Triton's interpreter
(TRITON_INTERPRET=1, on the CPU) against this function.

The rule, with the kernel's lines (speculator.py of vLLM 0.32.0):

- the context is the request's whole row, prompt and output alike, up to `seq_len`, which
  already holds the tokens sampled this step: the runner's post_update (v1/worker/gpu/
  input_batch.py, _post_update_kernel) writes them and sets last_sampled before propose runs
  (v1/worker/gpu/model_runner.py:2217, postprocess_sampled, before :2239, propose);
- a row is eligible when it sampled a token this step and `seq_len >= MIN_N` (:42);
- for every n in [MIN_N, MAX_N] and every start `pos` in [0, seq_len - n - 1] (:70-71: the
  match ends at least one token before the row's end, so the suffix never matches itself and
  at least one token follows), tokens[pos:pos+n] must equal the last n tokens (:72-80);
- the score n * (L + 1) + pos + 1 (:83), maximized over lanes and blocks (:86, :120), picks
  the LONGEST n, and among those the RIGHTMOST (latest) pos; V1 picks the longest too, but its
  EARLIEST occurrence (ngram_proposer.py:259-265, `prev_lps >= longest_ngram`);
- the draft starts right after the match, `pos + n` (:130), and takes the tokens that exist
  there, `seq_len - start` of them at most (:132, :139);
- EVERY one of the K slots is written (:147-148): a slot past the row's end, and all K slots
  of a row without a match, hold the last sampled token (V1 returns only the tokens it found,
  and none without a match: ngram_proposer.py:285-295);
- K is the config's num_speculative_tokens (propose ignores its num_speculative_tokens
  argument: :179, :273); the model runner masks the drafts beyond the step's K
  (model_runner.py:2256, `draft_tokens[:, num_spec_tokens:] = -1`) and the scheduler
  schedules that many (v1/worker/gpu/spec_decode/utils.py:87-88, DraftTokensHandler: every
  request returns num_draft_tokens placeholders), so a step drafts exactly its K;
- `gather_idx` is clamped to L - 1 (:138), which never binds on a valid slot
  (start + i < seq_len <= L); the scheduler's own max_model_len trim applies as on V1
  (tuner.replay.acceptance, MAX_MODEL_LEN).

The padded slots are verified as ordinary drafts (:145-146): a padded token is accepted where
the model's next token happens to equal the last one. So on V2 drafted tokens per step are K on
every decode step (the cost side: each request scores 1 + K per step, and every step is
uniform), and acceptance counts the padding too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np

# The n-gram paths a launch can take, as tuner.measure.enginepath records them
# (EngineInfo.details["ngram_path"]) and the replay models them.
V1 = "V1"  # the V1 model runner, method "ngram": vllm/v1/spec_decode/ngram_proposer.py (numba)
V2 = "V2"  # the V2 model runner, "ngram" or "ngram_gpu": the Triton scan above
PATHS = (V1, V2)


def match(tokens: np.ndarray, seq_len: int, min_n: int, max_n: int) -> tuple[int, int]:
    """(n, pos) of the match the V2 scan picks over tokens[:seq_len], (0, 0) for none."""
    return _match()(np.ascontiguousarray(tokens, dtype=np.int32), seq_len, min_n, max_n)


def propose(tokens: np.ndarray, seq_len: int, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The K drafts the V2 scan writes for a row whose first `seq_len` tokens are `tokens`
    (the last of them the token sampled last), as int32."""
    context = np.ascontiguousarray(tokens[:seq_len], dtype=np.int32)
    return find()(context, min_n, max_n, 1 << 30, k)


@functools.cache
def find():
    """The V2 rule as a numba function with the signature of V1's
    `_find_longest_matched_ngram_and_propose_tokens(context, min_n, max_n, max_model_len, k)`,
    so tuner.replay.acceptance steps either the same way. max_model_len is not read: the V2
    proposer has no such cap (the scheduler trims the drafts, as on V1)."""
    import numba

    match_fn = _match()

    @numba.njit
    def run(context, min_n, max_n, max_model_len, k):
        seq_len = len(context)
        out = np.empty(k, context.dtype)
        n, pos = match_fn(context, seq_len, min_n, max_n)
        last = context[seq_len - 1]  # last_sampled: post_update writes the row's last token
        start = pos + n
        for i in range(k):
            out[i] = context[start + i] if n > 0 and start + i < seq_len else last  # :139-147
        return out

    return run


@functools.cache
def _match():
    import numba

    @numba.njit
    def scan(tokens, seq_len, min_n, max_n):
        if seq_len < min_n:  # :42 (the row's eligibility; a decode step always sampled)
            return 0, 0
        # Longest n first, and within it the rightmost start: the first hit is the max score.
        for n in range(max_n, min_n - 1, -1):
            for pos in range(seq_len - n - 1, -1, -1):  # :70-71
                j = 0
                while j < n and tokens[pos + j] == tokens[seq_len - n + j]:
                    j += 1
                if j == n:
                    return n, pos
        return 0, 0

    return scan


UNKNOWN = "unknown"  # a prediction row's ngram_path where no launch said it (V1 is replayed)


def engine_path(recorded: Iterable[str | None]) -> str | None:
    """The n-gram path a study's engine takes, from what its n-gram launches recorded
    (tuner.measure.enginepath, EngineInfo.details["ngram_path"]): the one path they agree on;
    None, not known, where none recorded one, where they disagree, or where it is one the replay
    does not model (the V1 runner's ngram_gpu proposer, "V1-gpu")."""
    paths = {p for p in recorded if p}
    return next(iter(paths)) if len(paths) == 1 and paths <= set(PATHS) else None
