"""Golden studies: `tuner optimize` end to end, with only the measurement made up, gives the
same trials and the same outputs as the files under tests/data/golden/<case>/.

Written for issue 30 (a refactor that must leave behaviour unchanged): the CLI runs in this
process as a user runs it (argument parsing, input checks, the search loop, a real Optuna
journal, the replay strategy, the load-aware policy ladder, the analysis and every output);
only one function is replaced, the one that launches an engine and measures it
(`_deterministic_measurement`), by a fixed formula of the config and the level, so every
number is the same on every run. No engine is launched and nothing goes over the network;
the one subprocess is the `uname -p` of the machine fingerprint (platform.processor), which
with the vLLM import and the plots (about 35 s of CPU in all) puts this file under
integration/.

Each case compares, after `_normalised` drops what depends on the machine or the clock:
  trials.json          every study of the journal (the search, its policy companion) as
                       stored: directions, study attrs, and each trial's number, state,
                       values, params and user attrs
  trials.csv           as written (one row per config and level)
  recommendation.json  as written
  policy.json          as written (the `optimize --policy` case)
  predicted.csv        as written (the replay case)
  stdout.txt           what the CLI printed on stdout

Normalised (see VOLATILE_ATTRS and `_scrub`): this run's study folder and the checkout's path
become <study> and <repo>; trial attrs from the clock or the host (wall_s, ran_from, ran_to,
host, cuda_visible_devices) and the engine digest (a hash over the model's absolute path)
are dropped, as is a failure's time ("at"); the fingerprint keeps model, workload and its
digest, temperature and ignore_eos (not the tuner, vLLM and torch versions, the CPU or GPU
name, the entry point); the stored engine spec drops env and device (what this machine adds:
VLLM_CPU_* on a CPU host, nothing on a GPU host). JSON is compared with sorted keys.

Numbers compare to a relative 1e-9, so a refactor that reorders a float sum passes; any
other difference fails with a unified diff of the normalised files (for a CSV, also the
first differing row and column).

Regenerate the golden files (only when a change of behaviour is intended, and say so in the
commit):

    TUNER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_golden_study.py

Both cases need vLLM (its n-gram proposer replays the tokens: the replay strategy, and the
policy's predicted K curves): they fail, not skip, where vLLM is missing.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from study_fakes import fake_level

import tuner
from tuner import cli, tokens
from tuner.errors import EngineCrashed
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, Workload
from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
from tuner.testing.fake_completion import token_id

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
UPDATE = os.environ.get("TUNER_UPDATE_GOLDEN") == "1"
ROOT = str(Path(tuner.__file__).resolve().parent.parent)
REL_TOL = 1e-9


# --- the only seam ----------------------------------------------------------------------------
def _deterministic_measurement(monkeypatch: pytest.MonkeyPatch, lab: FakeLab) -> None:
    """Replace the one function that launches an engine for a config and measures it at every
    level (returns a BenchResult, raises TrialFailed, leaves tokens.npz in the trial folder).
    The search loop (through its executor), the replay strategy and the policy ladder all
    reach it through `tuner.measure.trial.measure_outcome`, which stays real (it turns a
    TrialFailed into a FAIL outcome and carries tokens.npz back).

    THIS IS THE ONLY LINE TO UPDATE if the refactor moves or renames the trial runner (and
    FakeLab.measure's signature, if the runner's changes)."""
    monkeypatch.setattr("tuner.measure.trial.measure", lab.measure)
    # The engine's limits default by device (vLLM's defaults: 128 sequences on the CPU build,
    # 1024 on a large GPU) and reach the K schedule, so the study runs as on a CPU host anywhere.
    monkeypatch.setattr("tuner.measure.machine.has_nvidia_gpu", lambda: False)


# --- the made-up measurement ------------------------------------------------------------------
JITTER = (0.0, 0.012, -0.009, 0.021, -0.017)  # the nth measurement of one config, cyclic


class FakeLab:
    """A made-up engine: figures from a fixed formula of the config and the level, the same on
    every run, and the token ids the fake engine (tuner.testing.fake_engine) would return.

    Step cost at level c with K draft tokens: 8 ms x (1 + 0.12 (c - 1)) + 0.5 K c^1.5 ms;
    tokens per step 1 + the per-position acceptance 0.55 - 0.06 (min - 1) + 0.02 (max - min),
    decaying by 0.8 per position. The speculative engine path (runner V1, no async scheduling,
    as vLLM 0.26 on the GPU) costs 4% of throughput at c=1 and 8% above it. So speculation
    pays at c=1 with a large K and fades at c=4 except for a small one. A config the engine
    refuses at start (`refuses`) raises EngineCrashed. Re-measurements of a config jitter by
    JITTER, in order."""

    def __init__(self, *, refuses: dict[str, Any] | None = None) -> None:
        self.refuses = refuses or {}
        self.seen: dict[str, int] = {}

    def measure(self, engine_spec: EngineSpec, config: TrialConfig, workload: Workload,
                settings: MeasureSettings, *, trial_dir: Path, schedule: Any = None, progress: Any = None,
                show_bar: bool = False) -> BenchResult:
        trial_dir.mkdir(parents=True, exist_ok=True)
        spec = config.speculative_config or {}
        if self.refuses and spec and all(spec.get(k) == v for k, v in self.refuses.items()):
            raise EngineCrashed(f"vLLM exited with status 1 before /health answered: "
                                f"ValueError: fake rejection of {self.refuses}",
                                log_tail="Traceback (most recent call last):\n"
                                         f"ValueError: fake rejection of {self.refuses}")
        n = self.seen.get(config.key(), 0)
        self.seen[config.key()] = n + 1
        jitter = 1.0 + JITTER[n % len(JITTER)]
        lo, hi = int(spec.get("prompt_lookup_min", 1)), int(spec.get("prompt_lookup_max", 1))
        first = 0.55 - 0.06 * (lo - 1) + 0.02 * (hi - lo)
        v1 = bool(spec) or (config.engine_args.get("no_async_scheduling") is True
                            and config.engine_env.get("VLLM_USE_V2_MODEL_RUNNER") == "0")
        output_len = workload.prompts[0].output_len
        levels, gaps = [], {}
        for c in settings.concurrencies:
            k = _k_at(spec, c)
            rates = tuple(round(first * 0.8 ** i, 6) for i in range(k))
            accept = 1.0 + sum(rates)
            step = 8.0 * (1 + 0.12 * (c - 1)) + 0.5 * k * c ** 1.5
            tpot = step / accept / (((0.96 if c == 1 else 0.92) if v1 else 1.0) * jitter)
            ttft = 20.0 + 3.0 * c + 0.4 * k
            tput = c * 1000.0 / (tpot + ttft / output_len)
            gaps[c] = tpot
            levels.append(LevelMetrics.model_validate(fake_level(
                c, output_throughput=tput, mean_tpot_ms=tpot, mean_ttft_ms=ttft,
                acceptance_length=accept if k else None, per_position=rates, k=k or None,
                num_requests=settings.requests_for(c, workload.spec.num_prompts),
                output_len=output_len)))
        self._capture(workload, settings, gaps, schedule).save(trial_dir / tokens.FILE_NAME)
        details = ({"model_runner": "V1", "async_scheduling": "false"} if v1 else
                   {"model_runner": "V2", "async_scheduling": "true"})
        return BenchResult(config=config, engine=EngineInfo(
            start_s=12.5, vllm_version="0.0.0+golden", details=details), levels=tuple(levels))

    @staticmethod
    def _capture(workload: Workload, settings: MeasureSettings, gaps: dict[int, float],
                 schedule: Any = None) -> tokens.TokenCapture:
        """As tuner.measure.trial sends them: per level its warm-ups then its requests, prompts
        drawn in order from the pool; the fake engine's ids (a word is a token, output token i
        is prompt word i, cyclically) and one chunk per token, `gaps[c]` ms apart; then the
        workload sample where `schedule` carries it (tuner.tokens.SAMPLE_LEVEL)."""
        out, cursor, pool = [], 0, workload.prompts
        for i, at in enumerate(schedule.sample if schedule is not None else ()):
            words = pool[at].prompt.split() or ["token"]
            n = pool[at].output_len
            out.append(tokens.RequestTokens(
                concurrency=tokens.SAMPLE_LEVEL, index=i, warmup=False,
                prompt=np.array([token_id(w) for w in words], dtype=np.int32),
                output=np.array([token_id(words[t % len(words)]) for t in range(n)],
                                dtype=np.int32), max_tokens=n))
        for c in settings.concurrencies:
            phases = ((True, settings.warmups_for(c)),
                      (False, settings.requests_for(c, workload.spec.num_prompts)))
            for warmup, count in phases:
                for i in range(count):
                    p = pool[(cursor + i) % len(pool)]
                    n = min(p.output_len, settings.warmup_output_len) if warmup else p.output_len
                    words = p.prompt.split() or ["token"]
                    out.append(tokens.RequestTokens(
                        concurrency=c, index=i, warmup=warmup,
                        prompt=np.array([token_id(w) for w in words], dtype=np.int32),
                        output=np.array([token_id(words[t % len(words)]) for t in range(n)],
                                        dtype=np.int32),
                        max_tokens=n, chunk_ms=np.full(n - 1, gaps[c], dtype=np.float32)))
                cursor += count
        return tokens.TokenCapture(requests=tuple(out))


def _k_at(spec: dict[str, Any], c: int) -> int:
    """K at batch size c, honouring num_speculative_tokens_per_batch_size as vLLM (and the
    fake engine) do: the band holding c, else the last band."""
    k = int(spec.get("num_speculative_tokens") or 0)
    bands = spec.get("num_speculative_tokens_per_batch_size")
    if not k or not bands:
        return k
    return min(k, next((int(b[2]) for b in bands if b[0] <= c <= b[1]), int(bands[-1][2])))


# --- the cases --------------------------------------------------------------------------------
COMMON = ["--model", str(EMBEDDED_TOKENIZER), "--vllm-cmd", "vllm serve",
          "--workload", "instructcoder", "--num-prompts", "4", "--output-len", "24",
          "--space", "ngram", "--study-name", "golden"]

CASES: dict[str, dict[str, Any]] = {
    # The Optuna search: seeded TPE, start points, --repeats of the leaders, an SLO, a config
    # the engine refuses (a FAIL trial with its reason and log tail), the aligned baseline the
    # speculative engine path calls for, and the load-aware policy on a ladder (its K curves
    # predicted by replay, its per-batch-size schedule verified).
    "optuna_tpe": dict(argv=[
        "--strategy", "optuna", "--sampler", "tpe", "--sampler-seed", "0", "--n-trials", "8",
        "--concurrency", "1,4", "--repeats", "2", "--max-tpot-ms", "12",
        "--policy", "--ladder", "1,2,4", "--policy-repeats", "2", "--leaders", "2"],
        refuses={"num_speculative_tokens": 3, "prompt_lookup_min": 1},
        files=("trials.csv", "recommendation.json", "policy.json")),
    # The replay strategy: baseline with tokens, every n-gram config replayed, a calibration
    # launch, the aligned baseline, leaders confirmed against the baseline until decided.
    "replay": dict(argv=[
        "--strategy", "replay", "--sampler-seed", "0", "--n-trials", "9",
        "--concurrency", "1,2"],
        refuses=None, files=("trials.csv", "recommendation.json", "predicted.csv")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_study(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = CASES[case]
    _deterministic_measurement(monkeypatch, FakeLab(refuses=spec["refuses"]))
    out = tmp_path / "study"
    rc = cli.main(["optimize", *COMMON, *spec["argv"], "--output-dir", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err[-4000:]
    got = {"trials.json": _json_text(_trials(out)),
           "stdout.txt": _normalised_text(printed.out, out)}
    for name in spec["files"]:
        got[name] = (out / name).read_text()
    _check(case, got, out)


# --- normalising: what depends on the machine or the clock --------------------------------------
# Trial user attrs written from the clock or the host (tuner.search.loop _tell,
# tuner.measure.trial measure_outcome), and the engine digest, a hash over the model's
# absolute path.
VOLATILE_ATTRS = {"wall_s", "ran_from", "ran_to", "host", "cuda_visible_devices",
                  "engine_digest"}
# Failure records carry the time they were made.
VOLATILE_KEYS = {"at"}
# The fingerprint's versions and hardware (tuner, vLLM, torch, CPU model, entry point).
FINGERPRINT_KEPT = ("model", "workload", "workload_digest", "temperature", "ignore_eos")


def _trials(out: Path) -> list[dict[str, Any]]:
    """Every study in the folder's journal (the search, and the policy ladder's companion) as
    stored: its directions and attrs, and each trial's number, state, values, params and user
    attrs; the storage's ids and datetimes left out."""
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "study.journal")))
    found = []
    for summary in sorted(optuna.get_all_study_summaries(storage), key=lambda s: s.study_name):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        found.append({
            "study": summary.study_name, "directions": [d.name for d in study.directions],
            "user_attrs": study.user_attrs,
            "trials": [{"number": t.number, "state": t.state.name, "values": t.values,
                        "params": t.params, "user_attrs": t.user_attrs}
                       for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)]})
    return found


def _json_text(doc: Any) -> str:
    return json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n"


def _normalised(name: str, text: str, out: Path) -> str:
    if name.endswith(".json"):
        return _json_text(_scrub(json.loads(_normalised_text(text, out))))
    return _normalised_text(text, out)


def _normalised_text(text: str, out: Path) -> str:
    """Paths of this run: the study folder and the checkout, as placeholders."""
    return text.replace(str(out), "<study>").replace(ROOT, "<repo>").replace(
        sys.executable, "<python>")


def _scrub(doc: Any) -> Any:
    if isinstance(doc, dict):
        kept = {k: _scrub(v) for k, v in doc.items()
                if k not in VOLATILE_ATTRS and k not in VOLATILE_KEYS}
        if "fingerprint" in kept and isinstance(kept["fingerprint"], dict):
            kept["fingerprint"] = {k: kept["fingerprint"].get(k) for k in FINGERPRINT_KEPT}
        if "engine_spec" in kept and isinstance(kept["engine_spec"], dict):
            # The environment and device the engine would get on this machine (CPU or GPU).
            kept["engine_spec"] = {k: v for k, v in kept["engine_spec"].items()
                                   if k not in ("env", "device")}
        return kept
    if isinstance(doc, list):
        return [_scrub(v) for v in doc]
    return doc


# --- comparing --------------------------------------------------------------------------------
def _check(case: str, got: dict[str, str], out: Path) -> None:
    folder = GOLDEN / case
    normal = {name: _normalised(name, text, out) for name, text in got.items()}
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in normal.items():
            (folder / name).write_text(text)
        return
    problems = []
    for name, text in sorted(normal.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{path} is missing: write it with TUNER_UPDATE_GOLDEN=1")
            continue
        want = path.read_text()
        if not _same_text(want, text):
            diff = difflib.unified_diff(want.splitlines(), text.splitlines(),
                                        f"golden/{case}/{name}", f"this run: {name}",
                                        lineterm="", n=2)
            problems.append("\n".join(list(diff)[:80]) + _first_difference(name, want, text))
    if problems:
        pytest.fail(f"golden study '{case}' differs from tests/data/golden/{case}/ (numbers "
                    f"compared to a relative {REL_TOL}):\n\n" + "\n\n".join(problems)
                    + "\n\nIf the change is intended: TUNER_UPDATE_GOLDEN=1 pytest "
                    "tests/integration/test_golden_study.py, and review the diff of the files.",
                    pytrace=False)


def _first_difference(name: str, want: str, got: str) -> str:
    """Where a CSV first differs, by row and column name (its lines are long)."""
    if not name.endswith(".csv"):
        return ""
    import csv
    import io

    a, b = list(csv.reader(io.StringIO(want))), list(csv.reader(io.StringIO(got)))
    if len(a) != len(b):
        return f"\n{name}: {len(a) - 1} rows in the golden file, {len(b) - 1} in this run"
    for row, (x, y) in enumerate(zip(a, b, strict=True)):
        for col, (u, v) in enumerate(zip(x, y, strict=False)):
            if not _same_line(u, v):
                header = a[0][col] if col < len(a[0]) else f"#{col}"
                return f"\n{name}: first difference in row {row}, column {header}: golden " \
                       f"{u!r}, this run {v!r}"
        if len(x) != len(y):
            return f"\n{name}: row {row} has {len(x)} cells in the golden file, {len(y)} here"
    return ""


def _same_text(want: str, got: str) -> bool:
    """Equal line by line, numbers within REL_TOL (a float summed in another order)."""
    if want == got:
        return True
    a, b = want.splitlines(), got.splitlines()
    return len(a) == len(b) and all(_same_line(x, y) for x, y in zip(a, b, strict=True))


def _same_line(a: str, b: str) -> bool:
    if a == b:
        return True
    ta, tb = _tokens(a), _tokens(b)
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not math.isclose(fx, fy, rel_tol=REL_TOL, abs_tol=1e-12):
            return False
    return True


def _tokens(line: str) -> list[str]:
    """A line split into numbers and the text between them."""
    import re

    return re.split(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)", line)
