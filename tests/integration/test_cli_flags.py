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
                   "--concurrency", "1,2", "--output-dir", str(tmp_path / "b"),
                   # one block per level, as these flags are counted against it (windows:
                   # tests/integration/test_trial_windows.py)
                   "--stability", "0", *argv])
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


def test_engine_env_is_recorded_in_the_measured_config_and_its_label(tmp_path, capsys):
    rc, err = _bench(tmp_path, capsys, "--engine-env", "TUNER_BENCH_MARK=1", "--concurrency",
                     "1", "--num-warmups", "0", "-q")
    assert rc == 0, err
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    assert result["config"]["engine_env"]["TUNER_BENCH_MARK"] == "1"
    assert "TUNER_BENCH_MARK" not in result["engine_spec"]["env"]  # one home: the config
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert "TUNER_BENCH_MARK=1" in summary[0]["label"]
    assert summary[0]["label"].startswith("baseline (no speculation) [")


def test_prompts_that_will_repeat_are_said_once_before_the_run(tmp_path, capsys):
    data = tmp_path / "three.jsonl"
    data.write_text("".join(f'{{"prompt": "question {i}"}}\n' for i in range(3)))
    rc, err = _bench(tmp_path, capsys, "--workload", "custom", "--dataset-path", str(data),
                     "--num-prompts", "2")
    assert rc == 0, err
    # c=1: 1 warm-up and 4 requests, c=2: 2 and 8 (requests = 4 per slot): 15 over 3 prompts.
    lines = err.splitlines()
    notes = [x for x in lines if x.startswith("Prompts will repeat")]
    assert notes == ["Prompts will repeat: each engine sends 15 requests (warm-ups included), "
                     "but workload 'custom' has only 3 prompts, so 12 of them repeat one "
                     "(counted per level as reused_prompts). To avoid it: a larger dataset, or "
                     "fewer --num-prompts or --requests-per-slot."]
    assert lines.index(notes[0]) < next(i for i, x in enumerate(lines)
                                        if x.startswith("Benchmarking"))
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    assert [lv["reused_prompts"] for lv in result["levels"]] == [2, 8]
