"""`tuner predict --traffic FILE` end to end: a `tuner bench` baseline's own requests.jsonl
replays to the acceptance `tuner predict` gives on the study built from that baseline's tokens
(a fake-engine study), and to the replay of stored real tokens (benchmarks/data/cpu-replay);
with --study, its figures are the study's own predictions; bad input exits 2 with one line
naming the record."""

from __future__ import annotations

import gzip
import json
import lzma
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import fake_engine_spec

from tuner import api, cli
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import OptimizeOptions
from tuner.replay import acceptance, sampling
from tuner.replay.predict import predict
from tuner.search import candidates
from tuner.search import space as spaces
from tuner.tokens import TokenCapture

pytestmark = pytest.mark.vllm  # steps vLLM's proposers and renders prompts with its code

STORED = (Path(__file__).parents[2] / "benchmarks" / "data" / "cpu-replay" /
          "sharegpt-8p-seed1-bf16.tar.xz")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A replay study on the fake engine at one level: a baseline with tokens, a calibration
    launch, a confirm launch. On the V1 model runner: a request log says nothing of the
    engine's runner, so the traffic replay steps V1's n-gram proposer, and the study it is
    compared with must run that one too (the fake's V2 runner would run the V2 scan)."""
    out = tmp_path_factory.mktemp("traffic") / "study"
    engine = fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5, tpot_ms=2,
                              env={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    api.optimize(OptimizeOptions(
        workload=WorkloadSpec(name="instructcoder", num_prompts=6, output_len=40),
        space_name="ngram", settings=MeasureSettings(concurrencies=(2,)), out_dir=out,
        study_name="s", n_trials=3, objectives=["output_throughput", "mean_tpot_ms"],
        target_concurrency=2, constraints={"max_tpot_ms": None, "max_ttft_ms": None},
        strategy="replay"), engine=engine, say=lambda _m: None)
    return out


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert cli.main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _by_key(rows: list[dict], c: int) -> dict[str, dict]:
    return {r["key"]: r for r in rows if r["concurrency"] == c}


def test_a_bench_baseline_requests_file_replays_as_predict_on_its_study(study, tmp_path,
                                                                        capsys):
    requests = study / "trials" / "0" / "requests.jsonl"
    assert requests.is_file() and (requests.parent / "tokens.npz").is_file()
    want = _by_key(_json(capsys, ["predict", str(study), "--space", "ngram", "--levels", "2",
                                  "--json"])["rows"], 2)
    got = _by_key(_json(capsys, ["predict", "--traffic", str(requests), "--space", "ngram",
                                 "--levels", "2", "--json", "--output-dir",
                                 str(tmp_path / "t")])["rows"], 2)
    spec = [k for k, r in want.items() if r["method"] == "ngram"]
    assert len(spec) == 160 and set(spec) <= set(got)
    for key in spec:
        for name in ("acceptance_length", "acceptance_rate"):
            assert got[key][name] == pytest.approx(want[key][name], rel=0.005), (key, name)
    # priced on the study itself, the figures are the study's own predictions
    priced = _by_key(_json(capsys, ["predict", str(study), "--traffic", str(requests),
                                    "--space", "ngram", "--levels", "2", "--json",
                                    "--output-dir", str(tmp_path / "p")])["rows"], 2)
    for key in spec + [next(k for k, r in want.items() if r["method"] == "none")]:
        for name in ("pred_output_throughput", "pred_mean_tpot_ms", "pred_speedup"):
            assert priced[key][name] == pytest.approx(want[key][name], rel=0.005), (key, name)
    doc = json.loads((tmp_path / "p" / "traffic.json").read_text())
    assert doc["study"] == str(study) and doc["requests"] == len(
        TokenCapture.load(requests.parent / "tokens.npz").level(2, warmup=False))


def test_priced_rows_carry_the_half_widths_predict_gives_a_sampled_baseline(study, tmp_path,
                                                                           capsys):
    requests = study / "trials" / "0" / "requests.jsonl"  # records without a temperature
    got = _by_key(_json(capsys, ["predict", str(study), "--traffic", str(requests), "--space",
                                 "ngram", "--levels", "2", "--json", "--output-dir",
                                 str(tmp_path / "p")])["rows"], 2)
    capture = TokenCapture.load(requests.parent / "tokens.npz")
    configs = candidates.candidates(spaces.load("ngram"))
    want = _by_key([r.csv_row() for r in predict(
        capture, configs, [], max_model_len=None, max_num_seqs=256, levels=[2],
        temperature=0.8).rows], 2)
    spread = 0
    for cfg in configs:
        g, w = got[cfg.key()], want[cfg.key()]
        for name in ("acceptance_length_pm", "acceptance_rate_pm"):
            assert g[name] == pytest.approx(w[name], rel=1e-6), (cfg.label(), name)
        # every request is played: throughput and TPOT carry the same relative half-width
        s = sampling.spread(acceptance.replay(capture, cfg,
                                              levels=[2])[2])
        if s is not None and g["pred_output_throughput"] is not None:
            spread += 1
            for name in ("pred_output_throughput", "pred_mean_tpot_ms"):
                assert g[f"{name}_pm"] == pytest.approx(g[name] * s.tokens_per_step_rel)
    assert spread > 100
    assert all(v is None for k, v in got[TrialConfig().key()].items() if k.endswith("_pm"))
    frame = pd.read_csv(tmp_path / "p" / "traffic.csv")
    assert frame["pred_output_throughput_pm"].notna().sum() == spread


def test_stored_real_tokens_replay_as_the_baseline_capture_predicts(tmp_path, capsys):
    with tarfile.open(STORED) as tar:
        tar.extractall(tmp_path / "set", members=[
            m for m in tar.getmembers() if m.name.startswith("./baseline/")], filter="data")
    folder = tmp_path / "set" / "baseline"
    capture = TokenCapture.load(folder / "tokens.npz")
    # The level-4 records only (with their warm-ups, which the replay skips).
    lines = [ln for ln in lzma.open(folder / "requests.jsonl.xz", "rt")
             if json.loads(ln)["concurrency"] == 4]
    (folder / "requests.jsonl").write_text("".join(lines))
    got = _by_key(_json(capsys, ["predict", "--traffic", str(folder / "requests.jsonl"),
                                 "--levels", "4", "--json", "--output-dir",
                                 str(tmp_path / "t")])["rows"], 4)
    configs = candidates.candidates(spaces.load("ngram"))
    want = _by_key([r.csv_row() for r in predict(
        capture, configs, [], max_model_len=None, max_num_seqs=256, levels=[4]).rows], 4)
    for cfg in configs:
        w, g = want[cfg.key()], got[cfg.key()]
        assert g["acceptance_length"] == pytest.approx(w["acceptance_length"], rel=0.005)
        assert g["drafted_per_step"] == pytest.approx(w["drafted_per_step"], rel=1e-9)
    assert len(capture.level(4, warmup=False)) == 8


def test_the_table_and_files_of_a_chat_log(tmp_path, capsys):
    log = tmp_path / "chat.jsonl"
    text = "def f(x):\n    return x + 1\n\ndef g(y):\n    return f(y) * 2\n"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"messages": [{"role": "user", "content": f"Rename f to h:\n{text}"}],
         "completion": text.replace("f(", "h("), "model": "HuggingFaceTB/SmolLM2-135M-Instruct"},
        {"prompt": f"Repeat this code:\n{text}", "completion": text, "temperature": 0.8},
        {"messages": [{"role": "user", "content": "hi"}], "completion": "hello", "warmup": True},
    ]) + "\n")
    capsys.readouterr()
    assert cli.main(["predict", "--traffic", str(log), "--levels", "1,4", "--top", "3",
                     "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Concurrency 1: 160 configs replayed; top 3 by acceptance length" in out
    assert "Concurrency 4:" in out and "acc rate" in out and "drafted/step" in out
    assert "2 requests replayed" in out and "Skipped 1 records: 1 warm-up requests" in out
    assert "1 requests were sampled at temperature > 0" in out
    assert "given as text only" in out
    frame = pd.read_csv(tmp_path / "out" / "traffic.csv")
    assert len(frame) == 2 * 161 and set(frame["concurrency"]) == {1, 4}
    assert np.isfinite(frame[frame["method"] == "ngram"]["acceptance_length"]).all()


@pytest.mark.parametrize("lines,expect", [
    (['{"completion": "x"}'], "line 1 has neither 'prompt' nor 'messages'"),
    (['{"prompt": "a b"}'], "line 1 has no answer"),
    (['{"prompt": "a", "completion": "b"}', '{"prompt": "a", "completion": "b'],
     "line 2 is not valid JSON"),
    (['{"prompt": "a", "completion": "b", "model": "m1"}',
      '{"prompt": "a", "completion": "b", "model": "m2"}'], "line 2 names model 'm2'"),
    ([], "is empty: no requests to replay"),
    (["name,prompt", "x,y"], "is neither JSONL"),
])
def test_bad_traffic_exits_2_naming_the_record(tmp_path, capsys, lines, expect):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(line + "\n" for line in lines))
    capsys.readouterr()
    assert cli.main(["predict", "--traffic", str(log), "--model", str(EMBEDDED_TOKENIZER),
                     "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("tuner: error: ") and expect in last and "Traceback" not in err


def test_a_missing_tokenizer_and_a_prompt_past_the_context(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"prompt": "a b", "completion": "c"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "tuner", "predict", "--traffic", str(log),
                           "--model", str(tmp_path / "no-such-model"), "--output-dir",
                           str(tmp_path / "o")], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "Pass --model with the model's folder" in done.stderr
    # A prompt longer than the embedded model's 8192 tokens: vLLM refuses it, the replay skips
    # it and says so.
    log.write_text(json.dumps({"prompt": "word " * 9000, "completion": "c d"}) + "\n"
                   + json.dumps({"prompt": "a b", "completion": "c d e"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "tuner", "predict", "--traffic", str(log),
                           "--output-dir", str(tmp_path / "o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert ("Skipped 1 records: 1 refused by vLLM's server: prompt longer than the model's "
            "context") in done.stdout


def test_predict_without_a_study_or_traffic_says_what_to_give(capsys):
    assert cli.main(["predict"]) == 2
    assert "give a study folder" in capsys.readouterr().err


def test_parquet_and_gzip_read_as_jsonl(tmp_path, capsys):
    rows = [{"prompt_token_ids": [5, 6, 7, 5, 6], "completion_token_ids": [7, 5, 6, 7, 8]},
            {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [1, 2, 3, 1]}]
    pd.DataFrame(rows).to_parquet(tmp_path / "log.parquet")
    with gzip.open(tmp_path / "log.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    a = _json(capsys, ["predict", "--traffic", str(tmp_path / "log.parquet"), "--json",
                       "--output-dir", str(tmp_path / "a")])
    b = _json(capsys, ["predict", "--traffic", str(tmp_path / "log.jsonl.gz"), "--json",
                       "--output-dir", str(tmp_path / "b")])
    assert a["rows"] == b["rows"] and any(r["acceptance_length"] for r in a["rows"])
    assert "Answers: the ids the engine emitted" in " ".join(a["notes"])
