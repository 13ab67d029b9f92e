"""A whole trial on the fake engine leaves its token capture (tuner/measure/trial.py).

The fake streams token ids as vLLM does (prompt ids in the first chunk, each chunk's new ids,
several per chunk under speculation, the EOS id counted when it stops), so the capture must
hold every ok request, warm-ups included, in the order the engine got them, agreeing id for
id with what requests.jsonl counted.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import fake_engine_spec

from tuner.measure import trial as runner
from tuner.records.configs import MeasureSettings, Prompt, TrialConfig, Workload, WorkloadSpec
from tuner.testing.fake_completion import EOS_ID, token_id
from tuner.tokens import FILE_NAME, TokenCapture

SETTINGS = MeasureSettings(concurrencies=(1, 3), num_requests=5, warmup_output_len=4)


def _workload() -> Workload:
    # Prompts of different lengths and output budgets: 7 tokens stop on EOS, 6 on length.
    prompts = tuple(Prompt(prompt=" ".join(f"w{i}x{j}" for j in range(3 + i % 4)),
                           prompt_len=3 + i % 4, output_len=6 + 3 * (i % 2)) for i in range(14))
    return Workload(spec=WorkloadSpec(name="random", num_prompts=8), prompts=prompts)


def _trial(tmp_path: Path, name: str) -> tuple[TokenCapture, list[dict], bytes]:
    spec = fake_engine_spec(tokens_per_chunk=3, output_tokens=7)
    out = runner.measure_outcome(spec, TrialConfig(), _workload(), SETTINGS, str(tmp_path / name))
    assert out.failure is None, out.failure
    path = tmp_path / name / FILE_NAME
    assert out.tokens is not None and out.tokens == path.read_bytes()
    records = [json.loads(x) for x in (tmp_path / name / "requests.jsonl").read_text().splitlines()]
    return TokenCapture.load(path), records, out.tokens


def test_a_trial_captures_every_request_as_the_engine_served_it(tmp_path) -> None:
    cap, records, _ = _trial(tmp_path, "a")
    # requests.jsonl lists each level's warm-ups then its measured requests, each by index:
    # the order the engine got them, which the capture keeps.
    assert [(r.concurrency, r.index, r.warmup) for r in cap.requests] == \
        [(r["concurrency"], r["index"], r["warmup"]) for r in records]
    assert len(cap) == 3 * 1 + 1 + 5 * 2  # warm-ups: one per slot
    assert "token_ids" not in json.dumps(records)
    budget = {tuple(token_id(w) for w in p.prompt.split()): p.output_len
              for p in _workload().prompts}
    for req, rec in zip(cap.requests, records, strict=True):
        assert len(req.output) == rec["output_tokens"] and len(req.prompt) == rec["prompt_tokens"]
        # max_tokens as sent: the prompt's own budget, or the warm-up's shorter one.
        assert req.max_tokens == (4 if req.warmup else budget[tuple(req.prompt.tolist())])
        # The fake's output token i is prompt token i, cyclically; it stops on EOS at 7.
        n = min(7, req.max_tokens)
        body = [int(req.prompt[t % len(req.prompt)]) for t in range(n)]
        if n < req.max_tokens:
            body[-1] = EOS_ID
        assert req.output.tolist() == body
        assert req.stopped_on_length == (req.max_tokens <= 7)
    assert cap.output_tokens() == sum(r["output_tokens"] for r in records if not r["warmup"])


def test_two_trials_of_one_workload_capture_the_same_tokens(tmp_path) -> None:
    _, _, first = _trial(tmp_path, "a")
    second, _, _ = _trial(tmp_path, "b")
    again = TokenCapture.from_bytes(first)
    assert [(r.prompt.tolist(), r.output.tolist()) for r in again.requests] == \
        [(r.prompt.tolist(), r.output.tolist()) for r in second.requests]
