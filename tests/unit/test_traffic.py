"""The traffic replay's parts: the sweep against tuner.replay.acceptance on real and random
tokens, the log reader's formats and messages, prompts rendered as vLLM's server renders them,
the capture's rules (tuner bench's records, skips, answer checks, one model a file), and the
table's rows."""

from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.errors import ConfigError
from tuner.measure.workloads import EMBEDDED_TOKENIZER, load_tokenizer
from tuner.outputs import traffic as traffic_out
from tuner.records.configs import TrialConfig
from tuner.records.results import RequestRecord
from tuner.replay import acceptance, sampling, traffic
from tuner.replay.traffic import capture, logs, price, prompts, sweep
from tuner.search import candidates
from tuner.search import space as spaces
from tuner.tokens import RequestTokens, TokenCapture

pytestmark = pytest.mark.vllm  # steps vLLM's proposers and renders with its code

STORED = (Path(__file__).parents[2] / "benchmarks" / "data" / "cpu-replay" /
          "sharegpt-8p-seed1-bf16.tar.xz")
NGRAM = candidates.candidates(spaces.load("ngram"))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(EMBEDDED_TOKENIZER)


@pytest.fixture(scope="module")
def stored() -> TokenCapture:
    """Real tokens: the embedded model's baseline over 16 ShareGPT requests."""
    with tarfile.open(STORED) as tar:
        data = tar.extractfile("./baseline/tokens.npz").read()
    cap = TokenCapture.from_bytes(data)
    return TokenCapture(tuple(dataclasses.replace(r, concurrency=1, index=i) for i, r in
                              enumerate(r for r in cap.requests if not r.warmup)))


def _packed(cap: TokenCapture) -> sweep.Requests:
    t = capture.Traffic(path=Path("x"), requests=capture._pack(
        [np.concatenate([r.prompt, r.output]) for r in cap.requests],
        [(len(r.prompt), len(r.output)) for r in cap.requests]),
        max_tokens=np.array([r.max_tokens for r in cap.requests]))
    return t.requests


def _same(got: acceptance.Acceptance, want: acceptance.Acceptance) -> None:
    a, b = dataclasses.asdict(got.summary()), dataclasses.asdict(want.summary())
    assert a == b, {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    assert got.accepted_per_pos == want.accepted_per_pos and got.past_end == want.past_end


def _random(seed: int, n: int = 12, vocab: int = 5) -> TokenCapture:
    rng = np.random.default_rng(seed)
    return TokenCapture(tuple(RequestTokens(
        1, i, False, rng.integers(0, vocab, int(rng.integers(3, 90))).astype(np.int32),
        rng.integers(0, vocab, int(rng.integers(1, 70))).astype(np.int32), max_tokens=70)
        for i in range(n)))


@pytest.mark.parametrize("max_model_len,chunk", [(None, sweep.CHUNK), (120, 5)])
def test_the_sweep_counts_every_ngram_config_as_the_replay_does(stored, max_model_len, chunk,
                                                                monkeypatch):
    monkeypatch.setattr(sweep, "CHUNK", chunk)  # requests a chunk at a time, summed
    for cap in (stored, _random(3)):
        reqs = _packed(cap)
        groups: dict = {}
        for cfg in NGRAM:
            lo, hi = acceptance.window(cfg)
            groups.setdefault(hi, []).append(((lo, cfg.k), cfg))
        for hi, group in groups.items():
            got = sweep.sweep(reqs, hi, [pair for pair, _ in group],
                              max_model_len=max_model_len)
            for pair, cfg in group:
                want = acceptance.replay(cap, cfg,
                                         max_model_len=max_model_len)[1]
                _same(got[pair].acceptance, want)
    assert sum(r.output.size for r in stored.requests) > 400  # real answers, not stubs


def test_sweepable_is_ngram_with_one_k():
    assert sweep.sweepable({"method": "ngram", "num_speculative_tokens": 3})
    assert not sweep.sweepable({"method": "suffix", "num_speculative_tokens": 3})
    assert not sweep.sweepable({"method": "ngram", "num_speculative_tokens": 3,
                                "num_speculative_tokens_per_batch_size": [[1, 4, 3]]})


# -- the log reader --------------------------------------------------------------------------
ROWS = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion_token_ids": [1, 2]}]


@pytest.mark.parametrize("kind", ["jsonl", "gz", "xz", "parquet", "noext"])
def test_every_format_reads_the_same_records(tmp_path, kind):
    text = "".join(json.dumps(r) + "\n" for r in ROWS)
    path = tmp_path / {"jsonl": "t.jsonl", "gz": "t.jsonl.gz", "xz": "t.jsonl.xz",
                       "parquet": "t.parquet", "noext": "t.log"}[kind]
    if kind == "parquet":
        import pandas as pd

        pd.DataFrame(ROWS).to_parquet(path)
    else:
        opener = {"gz": gzip.open, "xz": lzma.open}.get(kind, open)
        with opener(path, "wt") as f:
            f.write(text)
    got = list(logs.records(path))
    assert [(r.prompt_text, r.completion, r.answer_ids) for r in got] == [
        (row["prompt"], row.get("completion"), row.get("completion_token_ids")) for row in ROWS]
    assert got[1].where == f"{path}: {'row' if kind == 'parquet' else 'line'} 2"


def test_records_name_their_line_past_blank_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"b": 2}\n')
    assert [r.where for r in logs.records(path)] == [f"{path}: line 1", f"{path}: line 4"]


@pytest.mark.parametrize("content,expect", [
    (b"", "is empty"),
    (b"\n\n", "is empty"),
    (b'[{"prompt": "a"}]', "holds a JSON array"),
    (b"prompt,completion\n", "neither JSONL"),
    (b'{"a": 1}\n{"a": \n', "line 2 is not valid JSON"),
    (b'{"a": 1}\n[1, 2]\n', "line 2 is a JSON list, not an object"),
    (b'{"a": 1}\n{"a": "\xff"}\n', "line 2 is not UTF-8"),
])
def test_bad_files_are_refused_naming_the_line(tmp_path, content, expect):
    path = tmp_path / "t.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=expect):
        list(logs.records(path))


def test_a_broken_gzip_a_folder_and_a_parquet_without_pyarrow(tmp_path, monkeypatch):
    bad = tmp_path / "t.jsonl.gz"
    packed = gzip.compress("".join(json.dumps({"a": i * 7919}) + "\n" for i in range(5000))
                           .encode())
    bad.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(ConfigError, match="not a readable .gz file"):
        list(logs.records(bad))
    with pytest.raises(ConfigError, match="not a regular file"):
        list(logs.records(tmp_path))
    import importlib.util

    import pandas as pd

    pd.DataFrame(ROWS).to_parquet(tmp_path / "t.parquet")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pyarrow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'spec-tuner\[parquet\]'"):
        list(logs.records(tmp_path / "t.parquet"))


# -- prompts as vLLM's server renders them ---------------------------------------------------
def test_chat_and_completion_prompts_are_vllms(tok):
    r = prompts.Renderer(tok, model="m", max_model_len=prompts.context_len(tok))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": [{"type": "text", "text": "and 3+3?"}]}]
    plain = [*msgs[:3], {"role": "user", "content": "and 3+3?"}]
    assert r.chat(logs.LogRecord.parse("t", {"messages": msgs})) == tok.apply_chat_template(
        plain, add_generation_prompt=True, return_dict=False)
    assert r.completion("Hello there", None) == tok("Hello there").input_ids
    assert r.answer("Hi!") == tok("Hi!", add_special_tokens=False).input_ids
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert r.same_answer([*r.answer("Hi!"), eos], "Hi!") and r.same_answer(r.answer("Hi"), "Hi")
    assert not r.same_answer([*r.answer("Hi!"), 42], "Hi!")
    assert prompts.context_len(tok) == 8192
    with pytest.raises(prompts.Refused, match="maximum context length is 8192"):
        r.completion("word " * 9000, None)
    with pytest.raises(ValueError, match="messages"):
        r.chat(logs.LogRecord.parse("t", {"messages": "hello"}))


# -- the capture's rules ---------------------------------------------------------------------
def _read(path: Path, tok, **kw) -> capture.Traffic:
    return capture.read(path, tokenizer_for=lambda name: tok, context_of=prompts.context_len,
                        **kw)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_bench_requests_file_takes_its_ids_from_tokens_npz(tmp_path, stored):
    reqs = [dataclasses.replace(r, concurrency=2, index=i % 4, warmup=i < 2)
            for i, r in enumerate(stored.requests[:8])]
    reqs = [dataclasses.replace(r, index=i) for i, r in enumerate(reqs)]
    TokenCapture(tuple(reqs)).save(tmp_path / "tokens.npz")
    records = [RequestRecord(concurrency=2, index=r.index, warmup=r.warmup, start_s=0.0,
                             prompt_tokens=len(r.prompt), output_tokens=len(r.output))
               for r in reqs]
    records.append(RequestRecord(concurrency=2, index=99, warmup=False, start_s=0.0,
                                 error="HTTP 500"))
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))
    t = capture.read(path, tokenizer_for=_no_tokenizer)  # ids only: no tokenizer is loaded
    assert len(t) == 6 and t.skipped == {"warm-up requests": 2,
                                         "failed requests (an error recorded)": 1}
    got = t.capture(1)
    for mine, theirs in zip(got.requests, [r for r in reqs if not r.warmup], strict=True):
        assert np.array_equal(mine.prompt, theirs.prompt)
        assert np.array_equal(mine.output, theirs.output)
    (tmp_path / "tokens.npz").unlink()
    with pytest.raises(ConfigError, match="keeps no token ids: they are in tokens.npz"):
        capture.read(path, tokenizer_for=_no_tokenizer)


def _no_tokenizer(name):
    raise ConfigError(f"no tokenizer for {name}")


def test_answers_given_as_text_and_ids_are_compared(tmp_path, tok):
    ids = tok("def f(): pass", add_special_tokens=False).input_ids
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    path = _write(tmp_path / "t.jsonl", [
        {"prompt": "code", "completion": "def f(): pass", "completion_token_ids": [*ids, eos]},
        {"prompt": "code", "completion": "def f(): pass", "completion_token_ids": [*ids, 7]},
        {"prompt": "code", "completion": "def g(): pass"}])
    t = _read(path, tok)
    assert (t.answers_checked, t.answers_differ, t.text_answers) == (2, 1, 1)
    assert t.capture(1).requests[0].output.tolist() == [*ids, eos]  # the engine's ids
    notes = traffic.TrafficPrediction(rows=[], traffic=t, levels=[1], configs=0,
                                      seconds=0).notes()
    assert "1 of 2 given both as text and as the engine's ids re-tokenize" in " ".join(notes)


def test_skips_are_counted_with_their_reason(tmp_path, tok):
    path = _write(tmp_path / "t.jsonl", [
        {"prompt": "word " * 9000, "completion": "x"},
        {"prompt_token_ids": list(range(8000)), "completion_token_ids": list(range(300))},
        {"prompt": "a", "completion": ""},
        {"messages": [{"role": "user", "content": "hi"}], "completion": "hello", "warmup": True},
        {"messages": [{"role": "user", "content": "hi"}], "completion": "hello",
         "temperature": 0.7, "max_tokens": 64}])
    t = _read(path, tok)
    assert len(t) == 1 and t.sampled == 1 and t.max_tokens.tolist() == [64]
    assert t.skipped == {
        "refused by vLLM's server: prompt longer than the model's context": 1,
        "prompt + answer longer than the context (8192 tokens)": 1,
        "empty answers (no token to replay)": 1, "warm-up requests": 1}
    with pytest.raises(ConfigError, match="no request left to replay"):
        _read(_write(tmp_path / "w.jsonl", [{"prompt": "a", "completion": "b",
                                             "warmup": True}]), tok)


@pytest.mark.parametrize("rows,expect", [
    ([{"messages": [{"content": "no role"}], "completion": "x"}],
     "line 1: 'messages' is not a chat request vLLM accepts"),
    ([{"prompt_token_ids": [1, -2], "completion": "x"}], "'prompt_token_ids' must be a list"),
    ([{"prompt": "a", "completion": 5}], "'completion' is int"),
    ([{"prompt": "a", "completion": "b"}, {"prompt": "a", "completion": "b", "model": "m"}],
     "line 2 names model 'm', but the records before it named none"),
])
def test_unusable_records_are_refused_naming_the_line(tmp_path, tok, rows, expect):
    with pytest.raises(ConfigError, match=expect):
        _read(_write(tmp_path / "t.jsonl", rows), tok)


def test_a_skipped_record_is_not_refused_for_its_fields(tmp_path, tok):
    # logs.LogRecord keeps a field of the wrong type as Malformed: refused only where read.
    t = _read(_write(tmp_path / "t.jsonl", [
        {"prompt_token_ids": [1, -2], "completion": 5, "warmup": True},
        {"prompt": [3, "x"], "error": "HTTP 500"}, {"prompt": "a", "completion": "b"}]), tok)
    assert len(t) == 1 and t.skipped == {"warm-up requests": 1,
                                         "failed requests (an error recorded)": 1}


# -- the replayed table ----------------------------------------------------------------------
def test_predict_rows_per_level_and_configs_it_cannot_replay(tmp_path, stored):
    t = capture.Traffic(path=tmp_path, requests=_packed(stored),
                        max_tokens=np.array([len(r.output) for r in stored.requests]))
    ngram = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                            "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    sched = TrialConfig(speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
        "prompt_lookup_max": 4, "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 8, 0]]})
    eagle = TrialConfig(speculative_config={"method": "eagle", "model": "x",
                                            "num_speculative_tokens": 3})
    pred = traffic.predict(t, [ngram, sched, eagle], levels=[1, 4], max_model_len=None,
                           max_num_seqs=8)
    rows = {(r.key, r.concurrency): r for r in pred.rows}
    assert len(pred.rows) == 2 * 3 and pred.configs == 2
    assert any("eagle is not replayable" in s for s in pred.skipped)
    want = acceptance.replay(stored, ngram)[1]
    assert rows[(ngram.key(), 4)].acceptance_length == pytest.approx(want.acceptance_length)
    # the schedule turns speculation off at 4 requests in flight: replayed as a closed loop
    assert rows[(sched.key(), 1)].acceptance_length == pytest.approx(want.acceptance_length)
    assert rows[(sched.key(), 4)].num_draft_tokens < rows[(ngram.key(), 4)].num_draft_tokens
    assert rows[(TrialConfig().key(), 1)].drafted_per_step == 0.0
    text = traffic_out.table(pred.rows, top=5, levels=[1, 4])
    assert "Concurrency 4: 2 configs replayed; top 2 by acceptance length" in text
    assert "pred tok/s" not in text
    paths = traffic_out.write(pred.rows, {"traffic": "x"}, tmp_path / "out")
    doc = json.loads(paths["json"].read_text())
    assert doc["rows"][0]["concurrency"] == 1 and tuple(doc["rows"][0]) == traffic_out.COLUMNS


def test_the_played_sample_spreads_over_the_file():
    assert price.sample_rows(10).tolist() == list(range(10))
    rows = price.sample_rows(10_000)
    assert len(rows) == price.PLAY_REQUESTS and rows[0] == 0 and rows[-1] == 9_999
    assert np.all(np.diff(rows) > 30)


# -- the ± of a traffic's rows ---------------------------------------------------------------
@pytest.mark.parametrize("chunk", [sweep.CHUNK, 5])
def test_the_sweeps_half_widths_are_the_bootstrap_of_the_replay(stored, chunk, monkeypatch):
    """Per-request counts summed a chunk at a time resample exactly as sampling.spread
    resamples acceptance.replay's per-request lists: the same draws, the same half-widths."""
    monkeypatch.setattr(sweep, "CHUNK", chunk)
    some = 0
    for cap in (stored, _random(4, n=30)):
        groups: dict = {}
        for cfg in NGRAM:
            lo, hi = acceptance.window(cfg)
            groups.setdefault(hi, []).append(((lo, cfg.k), cfg))
        for hi, group in groups.items():
            got = sweep.sweep(_packed(cap), hi, [pair for pair, _ in group],
                              max_model_len=None)
            for pair, cfg in group:
                want = sampling.spread(acceptance.replay(cap, cfg)[1])
                np.testing.assert_equal(dataclasses.astuple(got[pair].spread) if want else None,
                                        dataclasses.astuple(want) if want else None)
                some += want is not None and want.acceptance_length > 0
    assert some > len(NGRAM)  # most configs draft: real half-widths, not None


def _traffic(stored: TokenCapture, path: Path, **kw) -> capture.Traffic:
    return capture.Traffic(path=path, requests=_packed(stored),
                           max_tokens=np.array([len(r.output) for r in stored.requests]), **kw)


def test_traffic_rows_carry_the_half_widths_tuner_predict_gives_a_sampled_baseline(
        tmp_path, stored):
    ngram = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                            "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    sched = TrialConfig(speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
        "prompt_lookup_max": 4, "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 8, 0]]})
    t = _traffic(stored, tmp_path, sampled=3)  # the rest say no temperature: computed anyway
    pred = traffic.predict(t, [ngram, sched], levels=[1, 4], max_model_len=None,
                           max_num_seqs=8)
    rows = {(r.key, r.concurrency): r for r in pred.rows}
    for cfg in (ngram, sched):  # the sweep's path and the replay's
        for c in (1, 4):
            acc = acceptance.replay(t.capture(c), cfg, max_num_seqs=8,
                                    levels=[c])[c]
            row = rows[(cfg.key(), c)]
            assert row == sampling.with_spread(row, acc, temperature=0.8)
            assert row.acceptance_rate_pm is not None
            assert row.pred_output_throughput_pm is None  # not priced
    assert 0 < rows[(ngram.key(), 4)].acceptance_length_pm < 1
    assert all(getattr(rows[(TrialConfig().key(), c)], k) is None for c in (1, 4)
               for k in sampling.PM_COLUMNS)
    assert "Each ± is the half-width of a 90% interval" in " ".join(pred.notes())
    text = traffic_out.table(pred.rows, top=5, levels=[1, 4])
    assert f"{rows[(ngram.key(), 1)].acceptance_length:.2f} ±" in text
    frame = pd.read_csv(traffic_out.write(pred.rows, {}, tmp_path / "out")["csv"])
    assert frame["acceptance_rate_pm"].notna().sum() == 4

    greedy = traffic.predict(_traffic(stored, tmp_path, greedy=len(t)), [ngram, sched],
                             levels=[1], max_model_len=None, max_num_seqs=8)
    assert all(getattr(r, k) is None for r in greedy.rows for k in sampling.PM_COLUMNS)
    assert "Every request says temperature 0" in " ".join(greedy.notes())
    assert "±" not in traffic_out.table(greedy.rows, top=5, levels=[1])


def test_the_reader_counts_greedy_and_sampled_records(tmp_path, tok):
    path = _write(tmp_path / "t.jsonl", [{"prompt": "a", "completion": "b", "temperature": 0},
                                         {"prompt": "a", "completion": "b", "temperature": 0.7},
                                         {"prompt": "a", "completion": "b"}])
    t = _read(path, tok)
    assert (t.greedy, t.sampled, t.greedy_only) == (1, 1, False)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[0]]) + "\n")
    assert _read(path, tok).greedy_only
