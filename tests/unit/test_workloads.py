"""The `random` workload draws vLLM's prompts: same NumPy generator, same order, same lengths."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.measure import workloads
from tuner.records.configs import WorkloadSpec

TOK = workloads.EMBEDDED_TOKENIZER


def _random(n: int, *, seed: int, input_len: int, output_len: int = 32):
    spec = WorkloadSpec(name="random", num_prompts=n, seed=seed, random_input_len=input_len,
                        random_output_len=output_len)
    return workloads.load(spec, tokenizer=TOK).prompts


@pytest.mark.vllm  # vLLM's own generator: fails where vLLM is missing (tests/conftest.py)
@pytest.mark.parametrize(("seed", "input_len"), [(0, 64), (7, 200)])
def test_random_prompts_are_vllms(seed, input_len):
    from vllm.benchmarks import datasets

    tok = workloads.load_tokenizer(TOK)
    theirs = datasets.RandomDataset(random_seed=seed).sample(
        tokenizer=tok, num_requests=6, input_len=input_len, output_len=32)
    ours = _random(6, seed=seed, input_len=input_len)
    assert [(p.prompt, p.prompt_len, p.output_len) for p in ours] == [
        (r.prompt, r.prompt_len, r.expected_output_len) for r in theirs]


def test_random_prompts_follow_the_seed_and_length():
    tok = workloads.load_tokenizer(TOK)
    a, b, c = (_random(4, seed=s, input_len=48) for s in (3, 3, 4))
    assert a == b and a != c
    assert len({p.prompt for p in a}) == 4
    for p in a:
        assert p.prompt_len == len(tok.encode(p.prompt, add_special_tokens=False))
        assert abs(p.prompt_len - 48) <= 2 and p.output_len == 32


def _parquet_spec(tmp_path) -> WorkloadSpec:
    path = tmp_path / "p.parquet"
    path.write_bytes(b"PAR1")  # never parsed: the check for pyarrow comes first
    return WorkloadSpec(name="custom", dataset_path=str(path), num_prompts=1, output_len=8)


def test_a_parquet_dataset_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pyarrow" else find_spec(name, *a))
    with pytest.raises(ConfigError) as e:
        workloads.load(_parquet_spec(tmp_path), tokenizer=TOK)
    assert "needs pyarrow" in str(e.value) and "spec-tuner[parquet]" in str(e.value)


def test_a_parquet_dataset_is_read(tmp_path):
    pytest.importorskip("pyarrow", reason="the parquet extra is not installed")
    import pandas as pd

    spec = _parquet_spec(tmp_path)
    pd.DataFrame({"prompt": ["def f(x):", "class A:"]}).to_parquet(spec.dataset_path)
    wl = workloads.load(spec.model_copy(update={"num_prompts": 2, "skip_chat_template": True}),
                        tokenizer=TOK)
    assert sorted(p.prompt for p in wl.prompts) == ["class A:", "def f(x):"]


def test_the_pool_is_what_the_data_holds(tmp_path):
    data = tmp_path / "three.jsonl"
    data.write_text("".join(f'{{"prompt": "question {i}"}}\n' for i in range(3)))
    spec = WorkloadSpec(name="custom", dataset_path=str(data), num_prompts=2, output_len=8)
    wl = workloads.load(spec, tokenizer=TOK, pool=15)
    assert len(wl.prompts) == 3  # which prompts, unchanged (tuner.measure.request_schedule)
