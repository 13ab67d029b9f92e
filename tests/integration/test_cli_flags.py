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
                   # no windows: these tests count requests, not steadiness
                   # (tests/integration/test_trial_schedule.py)
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


def test_too_few_prompts_shorten_the_levels_said_once_before_the_run(tmp_path, capsys):
    data = tmp_path / "six.jsonl"
    data.write_text("".join(f'{{"prompt": "question {i}"}}\n' for i in range(6)))
    rc, err = _bench(tmp_path, capsys, "--workload", "custom", "--dataset-path", str(data),
                     "--num-prompts", "2")
    assert rc == 0, err
    # c=1: 1 warm-up and 4 requests, c=2: 2 and 8 (4 per slot): 15 asked of 6 prompts.
    lines = err.splitlines()
    notes = [x for x in lines if x.startswith("Levels shortened")]
    assert notes == ["Levels shortened so no engine sees a prompt twice: workload 'custom' has "
                     "6 distinct prompts for 3 warm-ups and 12 measured requests; measured "
                     "requests c=1 1 of 4, c=2 2 of 8. For full levels: a larger dataset, or "
                     "--allow-repeats."]
    assert lines.index(notes[0]) < next(i for i, x in enumerate(lines)
                                        if x.startswith("Benchmarking"))
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    assert [lv["num_prompts"] for lv in result["levels"]] == [1, 2]
    assert [lv["reused_prompts"] for lv in result["levels"]] == [0, 0]
    assert [lv["measured"] for lv in result["schedule"]["levels"]] == [[1], [4, 5]]


def test_a_level_with_no_prompt_left_is_refused_unless_repeats_are_allowed(tmp_path, capsys):
    data = tmp_path / "three.jsonl"
    data.write_text("".join(f'{{"prompt": "question {i}"}}\n' for i in range(3)))
    rc, err = _bench(tmp_path, capsys, "--workload", "custom", "--dataset-path", str(data),
                     "--num-prompts", "2")
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [
        "tuner: error: workload 'custom' has 3 distinct prompts, but the levels 1,2 need 3 "
        "warm-ups and at least one measured request each, none sent twice. Use a larger "
        "dataset, fewer --concurrency levels or --num-warmups, or --allow-repeats (suffix "
        "decoding then learns from the repeats)."]
    assert not (tmp_path / "b" / "result.json").exists()
    rc, err = _bench(tmp_path, capsys, "--workload", "custom", "--dataset-path", str(data),
                     "--num-prompts", "2", "--allow-repeats")
    assert rc == 0, err
    assert any(x.startswith("--allow-repeats: 12 of the 15 requests each engine sends repeat "
                            "a prompt") for x in err.splitlines())
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    assert [lv["reused_prompts"] for lv in result["levels"]] == [2, 8]
