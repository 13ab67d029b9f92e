"""The V2 model runner's n-gram rule (tuner.replay.ngram_v2) against vLLM's own Triton kernels.

vLLM's kernels run here in Triton's interpreter on the CPU (tests/vllm_ngram_v2_kernel.py says
how, and the three stand-ins it needs, none of which changes what a kernel computes), over
rows built to tell the rules apart: small alphabets (so most suffixes recur, several times),
matches near the row's end (padding), rows shorter than the window, one- and three-block
scans (max_model_len 64: BLOCK_L 64; 300: BLOCK_L 128, 3 blocks, so the cross-block max of
_ngram_finalize_kernel counts). Then the replay's stepping on the V2 path: every step drafts
K, the padding is verified as drafts, and V1 is what it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner.records.configs import TrialConfig
from tuner.replay import acceptance, ngram_v2
from tuner.tokens import RequestTokens, TokenCapture


def replay_spec(capture, spec, **kwargs):
    """acceptance.replay of the --speculative-config `spec`."""
    return acceptance.replay(capture, TrialConfig(speculative_config=spec), **kwargs)


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "vllm_ngram_v2_kernel.py"

# Rows that tell V2's rule from V1's and from plausible misreadings, (tokens, min_n, max_n, k).
HANDMADE = [
    ([5, 1, 2, 9, 1, 2, 7, 1, 2], 1, 3, 4),  # "1 2" twice before: V2 the later (V1 the earlier)
    ([1, 2, 3, 4, 1, 2, 3], 1, 3, 4),  # the longest n wins over a later shorter one
    ([1, 2, 3], 1, 3, 4),  # no match: K copies of the last token
    ([4, 4], 1, 1, 3),  # the match may overlap the suffix; one token left, then padding
    ([4, 4, 4, 4], 2, 3, 5),
    ([7, 8], 2, 2, 2),  # seq_len == MIN_N: no candidate position
    ([7], 2, 3, 2),  # seq_len < MIN_N
    ([3, 1, 3, 1, 3], 1, 4, 8),
]


def _random_rows(rng: np.random.Generator, n: int, *, longest: int, alphabet: int) -> list:
    rows = []
    for _ in range(n):
        size = int(rng.integers(1, longest + 1))
        rows.append(rng.integers(0, alphabet, size).tolist())
    return rows


def _groups() -> list[dict]:
    rng = np.random.default_rng(39)
    groups = []
    for (min_n, max_n, k), (length, longest) in zip(
            [(1, 1, 1), (1, 3, 4), (2, 5, 3), (3, 3, 8), (5, 5, 5), (1, 4, 7)],
            [(64, 60), (64, 64), (300, 300), (64, 40), (300, 290), (300, 300)], strict=True):
        rows = _random_rows(rng, 12, longest=longest, alphabet=int(rng.choice([2, 3, 5])))
        groups.append(dict(min_n=min_n, max_n=max_n, k=k, max_model_len=length, rows=rows))
    for row, min_n, max_n, k in HANDMADE:
        groups.append(dict(min_n=min_n, max_n=max_n, k=k, max_model_len=64, rows=[row]))
    return groups


@pytest.fixture(scope="module")
def kernel_drafts() -> tuple[list[dict], list[dict]]:
    groups = _groups()
    done = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps(groups),
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return groups, json.loads(done.stdout)


@pytest.mark.vllm
def test_the_v2_rule_drafts_what_vllms_triton_kernels_draft(kernel_drafts) -> None:
    groups, found = kernel_drafts
    # The scans ran with one block and with three (the finalize kernel's max across blocks).
    assert {(g["block_l"], g["n_blocks"]) for g in found} == {(64, 1), (128, 3)}
    checked = told = 0
    for group, got in zip(groups, found, strict=True):
        for row, kernel in zip(group["rows"], got["drafts"], strict=True):
            mine = ngram_v2.propose(np.array(row), len(row), group["min_n"], group["max_n"],
                                    group["k"])
            assert mine.tolist() == kernel, (row, group)
            checked += 1
            told += _earliest(row, group["min_n"], group["max_n"], group["k"]) != kernel
    assert checked == 6 * 12 + len(HANDMADE)
    # The rows have the power to tell: the earliest occurrence (V1's choice) drafts otherwise
    # on many of them.
    assert told >= 10


def _earliest(row: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The V2 rule with the earliest occurrence of the longest n-gram instead of the latest."""
    L = len(row)
    for n in range(max_n, min_n - 1, -1):
        for pos in range(0, L - n):
            if row[pos:pos + n] == row[L - n:]:
                got = row[pos + n:pos + n + k]
                return got + [row[-1]] * (k - len(got))
    return [row[-1]] * k


@pytest.mark.vllm
def test_the_handmade_rows_read_as_the_kernels_lines_say(kernel_drafts) -> None:
    """What each handmade row shows, in the kernel's outcome (so a misreading is named)."""
    _, found = kernel_drafts
    got = [g["drafts"][0] for g in found[-len(HANDMADE):]]
    assert got[0] == [7, 1, 2, 2]  # rightmost "1 2" (pos 4), 3 tokens after it, padded
    assert got[1] == [4, 1, 2, 3]  # "1 2 3" (n=3) at pos 0: the longest n
    assert got[2] == [3, 3, 3, 3]  # no match: every slot the last sampled token
    assert got[3] == [4, 4, 4]  # pos 0 matches "4"; one token (the suffix's own) follows
    assert got[5] == [8, 8] and got[6] == [7, 7]  # too short to match


@pytest.mark.vllm
def test_v1_picks_the_earliest_occurrence_where_v2_picks_the_latest() -> None:
    row = np.array([5, 1, 2, 9, 1, 2, 7, 1, 2], np.int32)
    v1 = acceptance._ngram_fn()(row, 1, 3, 1 << 30, 4)
    assert v1.tolist() == [9, 1, 2, 7]  # vLLM's numba function: "1 2" at pos 1
    assert ngram_v2.propose(row, len(row), 1, 3, 4).tolist() == [7, 1, 2, 2]
    assert ngram_v2.match(row, len(row), 1, 3) == (2, 4)


def _capture(prompt: list[int], output: list[int]) -> TokenCapture:
    req = RequestTokens(concurrency=1, index=0, warmup=False, prompt=np.array(prompt, np.int32),
                        output=np.array(output, np.int32), max_tokens=len(output) + 1)
    return TokenCapture(requests=(req,))


@pytest.mark.vllm
@pytest.mark.parametrize("closed_loop", [False, True])
def test_on_v2_every_decode_step_drafts_k_and_padding_is_verified(closed_loop) -> None:
    prompt, output = [1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9, 9, 9, 2, 8]
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 2}
    if closed_loop:  # a one-band schedule: the stepping path of _closed_loop, same K
        spec["num_speculative_tokens_per_batch_size"] = [[1, 8, 3]]
    v2 = replay_spec(_capture(prompt, output), spec, ngram_path="V2", max_num_seqs=8,
                           trace=True)[1]
    steps = v2.trace[0]
    assert all(d == 3 for d, _ in steps)  # K on every step, matched or not
    assert v2.drafted_per_step == 3.0 and v2.uniform_share == 1.0
    assert v2.drafts == v2.steps  # every step counts as a draft (vLLM's num_drafts)
    # The "9 9 9" run: no n-gram "9" before it, so the drafts are the padding "9 9 9", and
    # they are accepted (the padding is verified as drafts).
    assert (3, 3) in steps
    v1 = replay_spec(_capture(prompt, output), spec, ngram_path="V1", max_num_seqs=8,
                           trace=True)[1]
    assert any(d < 3 for d, _ in v1.trace[0])  # V1 drafts only what it found
    assert v1.drafted_per_step < v2.drafted_per_step


@pytest.mark.vllm
def test_the_v2_stepping_kernel_equals_stepping_in_python() -> None:
    """The compiled per-request loop (_independent) and _closed_loop's Python stepping with a
    one-band schedule are the same rules on V2, as they are on V1."""
    rng = np.random.default_rng(7)
    reqs = tuple(RequestTokens(concurrency=1, index=i, warmup=False,
                               prompt=rng.integers(0, 4, 30).astype(np.int32),
                               output=rng.integers(0, 4, 60).astype(np.int32),
                               max_tokens=61)
                 for i in range(6))
    cap = TokenCapture(requests=reqs)
    base = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}
    fast = replay_spec(cap, base, ngram_path="V2", trace=True, max_model_len=85)[1]
    slow = replay_spec(cap, {**base, "num_speculative_tokens_per_batch_size": [[1, 8, 4]]},
                             ngram_path="V2", trace=True, max_num_seqs=8, max_model_len=85)[1]
    assert fast.trace == slow.trace
    assert (fast.draft_tokens, fast.accepted_tokens) == (slow.draft_tokens, slow.accepted_tokens)
    # MAX_MODEL_LEN: the scheduler's trim applies on V2 too (a step near 85 drafts less).
    assert any(d < 4 for steps in fast.trace.values() for d, _ in steps)


def test_an_unknown_path_name_is_refused() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="n-gram path"):
        replay_spec(_capture([1, 2], [3, 4]), spec, ngram_path="V3")
