"""`tuner bench` end to end against the fake engine: the vLLM bench flags that reach a trial
(--num-warmups, --metadata) and what -v shows (the engine's start command, key hidden)."""

from __future__ import annotations

import json
import shlex
import sys

from conftest import fake_engine_spec

from tuner import cli
from tuner.measure.workloads import EMBEDDED_TOKENIZER


def _bench(tmp_path, capsys, *argv: str) -> tuple[int, str]:
    spec = fake_engine_spec()
    env = [f"--engine-env={k}={v}" for k, v in spec.env.items()]
    rc = cli.main(["bench", "--model", str(EMBEDDED_TOKENIZER), "--vllm-cmd",
                   shlex.join(spec.vllm_cmd), *env, "--num-prompts", "4", "--output-len", "8",
                   "--concurrency", "1,2", "--output-dir", str(tmp_path / "b"), *argv])
    return rc, capsys.readouterr().err


def test_num_warmups_and_metadata_reach_the_trial_and_result_json(tmp_path, capsys):
    rc, err = _bench(tmp_path, capsys, "--num-warmups", "3", "--metadata", "gpu=none",
                     "run=7", "-q")
    assert rc == 0, err
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    assert result["metadata"] == {"gpu": "none", "run": "7"}
    assert [lv["warmup_requests"] for lv in result["levels"]] == [3, 3]
    records = [json.loads(x) for x in (tmp_path / "b" / "requests.jsonl").read_text().split()]
    assert [r["concurrency"] for r in records if r["warmup"]] == [1, 1, 1, 2, 2, 2]


def test_no_warmups_and_the_default_of_one_per_slot(tmp_path, capsys):
    rc, err = _bench(tmp_path, capsys, "--num-warmups", "0", "-q")
    assert rc == 0, err
    records = (tmp_path / "b" / "requests.jsonl").read_text()
    assert '"warmup":true' not in records.replace(" ", "")
    rc, err = _bench(tmp_path, capsys, "-q")
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    assert rc == 0 and [lv["warmup_requests"] for lv in result["levels"]] == [1, 2]


def test_verbose_echoes_the_engine_command_without_its_key(tmp_path, capsys):
    rc, err = _bench(tmp_path, capsys, "-v", "--num-warmups", "0", "--concurrency", "1")
    assert rc == 0, err
    line = next(x for x in err.splitlines() if x.startswith("tuner: debug: starting vLLM: "))
    assert f"{sys.executable} -m tuner.testing.fake_engine --model" in line
    assert "--api-key '***'" in line and "tuner-" not in line
    assert line.endswith(f"(log: {tmp_path / 'b' / 'engine.log'})")
