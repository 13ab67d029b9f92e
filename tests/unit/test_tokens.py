"""Token capture (tuner/tokens.py): the codec, and how a trial builds a capture from its records.

A capture travels as bytes from a Ray worker and lies on disk beside its trial, so what comes
out must be what went in, request for request and id for id, and a capture that would not be
exact (an engine without token ids) must not exist at all.
"""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from tuner.measure.trial import capture_tokens
from tuner.records.configs import Prompt, TrialConfig
from tuner.records.results import BenchResult, EngineInfo, RequestRecord
from tuner.records.trials import TrialOutcome
from tuner.tokens import FILE_NAME, RequestTokens, TokenCapture


def _capture() -> TokenCapture:
    rng = np.random.default_rng(0)

    def req(c: int, i: int, warm: bool, plen: int, olen: int, max_tokens: int) -> RequestTokens:
        return RequestTokens(concurrency=c, index=i, warmup=warm,
                             prompt=rng.integers(0, 49152, plen, dtype=np.int32),
                             output=rng.integers(0, 49152, olen, dtype=np.int32),
                             max_tokens=max_tokens)

    return TokenCapture(requests=(
        req(1, 0, True, 7, 4, 4), req(1, 0, False, 30, 12, 64), req(1, 1, False, 1, 0, 8),
        req(4, 0, True, 5, 16, 16), req(4, 3, False, 0, 9, 9), req(4, 1, False, 200, 64, 64)))


def _same(a: TokenCapture, b: TokenCapture) -> None:
    assert len(a) == len(b)
    for x, y in zip(a.requests, b.requests, strict=True):
        assert (x.concurrency, x.index, x.warmup, x.max_tokens) == \
            (y.concurrency, y.index, y.warmup, y.max_tokens)
        assert x.prompt.tolist() == y.prompt.tolist() and x.output.tolist() == y.output.tolist()


def test_a_capture_survives_bytes_and_a_file(tmp_path) -> None:
    cap = _capture()
    back = TokenCapture.from_bytes(cap.to_bytes())
    _same(cap, back)
    assert back.requests[0].prompt.dtype == np.int32
    assert back.levels() == [1, 4]
    assert [r.index for r in back.level(4, warmup=False)] == [3, 1]  # order kept, not sorted
    assert back.output_tokens() == 12 + 0 + 9 + 64  # measured requests only
    assert [r.stopped_on_length for r in back.requests] == [True, False, False, True, True, True]
    path = cap.save(tmp_path / FILE_NAME)
    assert not (tmp_path / (FILE_NAME + ".tmp")).exists()
    _same(cap, TokenCapture.load(path))


def test_an_empty_capture_round_trips() -> None:
    back = TokenCapture.from_bytes(TokenCapture(requests=()).to_bytes())
    assert len(back) == 0 and back.levels() == [] and back.output_tokens() == 0


def test_bytes_that_disagree_with_their_table_are_refused() -> None:
    import io

    buf = io.BytesIO()
    np.savez_compressed(buf, ids=np.arange(5, dtype=np.int32),
                        table=np.array([[1, 0, 0, 2, 2, 4]], dtype=np.int64),
                        columns=np.array(("concurrency", "index", "warmup", "prompt_len",
                                          "output_len", "max_tokens")))
    with pytest.raises(ValueError, match="inconsistent: 5 ids, table says 4"):
        TokenCapture.from_bytes(buf.getvalue())


def test_an_outcome_with_tokens_survives_pickle_as_ray_ships_it() -> None:
    data = _capture().to_bytes()
    outcome = TrialOutcome(result=BenchResult(config=TrialConfig(), engine=EngineInfo(start_s=1.0),
                                              levels=()), tokens=data, host="worker-3")
    back = pickle.loads(pickle.dumps(outcome))
    assert back == outcome and back.tokens == data
    _same(_capture(), TokenCapture.from_bytes(back.tokens))


def _rec(c: int, i: int, *, warmup: bool = False, ids: bool = True, error: str | None = None,
         out: int = 3) -> RequestRecord:
    return RequestRecord(
        concurrency=c, index=i, warmup=warmup, start_s=0.0, output_tokens=0 if error else out,
        error=error, prompt_token_ids=(c, i, int(warmup)) if ids and not error else None,
        output_token_ids=tuple(range(100 * c + i, 100 * c + i + out)) if ids and not error
        else None)


def _prompts(n: int, output_len: int) -> list[Prompt]:
    return [Prompt(prompt=f"p{i}", prompt_len=1, output_len=output_len + i) for i in range(n)]


def test_a_trial_captures_levels_in_order_warm_ups_first_each_by_index() -> None:
    # Records come as the load generator returns them; phases as measure() ran them.
    sent = [
        ([_rec(2, 1, warmup=True), _rec(2, 0, warmup=True)], _prompts(2, 4)),
        ([_rec(2, 2), _rec(2, 0), _rec(2, 1, error="HTTP 500: boom")], _prompts(3, 50)),
        ([_rec(1, 0, warmup=True)], _prompts(1, 4)),
        ([_rec(1, 0), _rec(1, 1)], _prompts(2, 80)),
    ]
    cap, why = capture_tokens(sent)
    assert why == ""
    assert [(r.concurrency, r.index, r.warmup) for r in cap.requests] == [
        (2, 0, True), (2, 1, True), (2, 0, False), (2, 2, False),  # the failed one left out
        (1, 0, True), (1, 0, False), (1, 1, False)]
    # max_tokens is what that request was sent with: its own prompt's output_len.
    assert [r.max_tokens for r in cap.requests] == [4, 5, 50, 52, 4, 80, 81]
    assert cap.requests[3].prompt.tolist() == [2, 2, 0]
    assert cap.requests[3].output.tolist() == [202, 203, 204]
    assert cap.levels() == [2, 1]


def test_no_capture_when_the_engine_returned_no_ids() -> None:
    sent = [([_rec(1, 0, warmup=True, ids=False)], _prompts(1, 4)),
            ([_rec(1, 0, ids=False), _rec(1, 1, ids=False)], _prompts(2, 8))]
    cap, why = capture_tokens(sent)
    assert cap is None
    assert why == "this vLLM returned no token ids; replay is unavailable for this trial"


def test_one_measured_request_without_exact_ids_means_no_capture() -> None:
    sent = [([_rec(1, 0), _rec(1, 1, ids=False), _rec(1, 2)], _prompts(3, 8))]
    cap, why = capture_tokens(sent)
    assert cap is None
    assert why.startswith("1 of 3 measured requests came back without exact token ids")


def test_a_warm_up_without_ids_is_left_out_of_an_otherwise_exact_capture() -> None:
    sent = [([_rec(1, 0, warmup=True, ids=False)], _prompts(1, 4)),
            ([_rec(1, 0)], _prompts(1, 8))]
    cap, _ = capture_tokens(sent)
    assert [(r.index, r.warmup) for r in cap.requests] == [(0, False)]


def test_token_ids_stay_out_of_requests_jsonl() -> None:
    dumped = _rec(1, 0).model_dump_json()
    assert "token_ids" not in dumped and '"output_tokens":3' in dumped


def test_chunk_gaps_travel_with_the_capture_and_older_files_load_without_them() -> None:
    cap = _capture()
    gaps = [np.array([31.5, 35.25], np.float32), np.zeros(0, np.float32)] * 3
    with_gaps = TokenCapture(requests=tuple(
        RequestTokens(r.concurrency, r.index, r.warmup, r.prompt, r.output, r.max_tokens,
                      chunk_ms=g) for r, g in zip(cap.requests, gaps, strict=True)))
    back = TokenCapture.from_bytes(with_gaps.to_bytes())
    _same(cap, back)
    assert [r.chunk_ms.tolist() for r in back.requests] == [g.tolist() for g in gaps]
    assert back.digest == cap.digest  # timings are not tokens
    # A capture written before gaps were kept: ids, table and columns only.
    buf = io.BytesIO()
    with np.load(io.BytesIO(cap.to_bytes())) as z:
        np.savez_compressed(buf, ids=z["ids"], table=z["table"], columns=z["columns"])
    old = TokenCapture.from_bytes(buf.getvalue())
    _same(cap, old)
    assert all(len(r.chunk_ms) == 0 for r in old.requests)


def test_a_trial_keeps_each_requests_chunk_gaps_in_ms() -> None:
    rec = _rec(1, 0).model_copy(update={"chunk_gaps_s": (0.031, 0.0355)})
    cap, _ = capture_tokens([([rec], _prompts(1, 8))])
    assert cap.requests[0].chunk_ms.tolist() == pytest.approx([31.0, 35.5], rel=1e-6)
