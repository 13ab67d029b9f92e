"""docs/accuracy.md: the replay's prediction errors on every stored data set, as Markdown.

CPU: per set of benchmarks/data/cpu-replay, the summary of benchmarks/replay_refit.py's refit()
(the step cost fitted as the replay strategy fits it, the other configs predicted). GPU: per
set of benchmarks/data/h200 that a replay study could fit on, the out-of-sample throughput
errors of benchmarks/stepcost_h200.py's compare() under both step-cost models. Drafter K axis:
per set of benchmarks/data/cpu-drafter-k, benchmarks/drafter_k.py's rows() (every K predicted
from the launch at the largest K) against the launches at the smaller K. Nothing is fitted
here: the numbers are whatever this checkout's predictor gives.

The output is deterministic (sets in a fixed order, fixed float formats, no timings or paths
of this machine), so the file can be held to it: tests/integration/test_accuracy_doc.py fails when
docs/accuracy.md is not what this prints.

    .venv/bin/python benchmarks/accuracy_tables.py > docs/accuracy.md
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from drafter_k import rows as drafter_rows  # noqa: E402
from replay_refit import open_set, refit, set_names  # noqa: E402
from stepcost_h200 import compare  # noqa: E402

DATA = Path(__file__).parent / "data"
COMMAND = ".venv/bin/python benchmarks/accuracy_tables.py > docs/accuracy.md"
# Issue 49's goal for the acceptance length predicted at a K not launched.
DRAFTER_GOAL_PCT = 3.0
DRAFTER_TPUT_GOAL_PCT = 5.0  # ... and for its throughput out of sample
# Drafter sets whose launches' throughput cannot be compared with each other, and why (each
# set's SOURCE.md says it in full): their throughput errors are left out of the table.
LOADED = {"skip2-7-8p-64t": "measured on the shared 2-core host under load (load average "
                            "5-10) that moved several-fold between launches"}
# Drafter sets the acceptance model was written after seeing: their launches at smaller K are
# not used by the prediction, but they are no out-of-sample test of the model itself.
SEEN = {"skip2-7-8p-64t": "the segment model was written after seeing this set's errors under "
                          "the first model (1 + the first K rates: -1.1% to -4.4%)"}


def _order(name: str) -> list:
    """Natural order: sharegpt-8p before sharegpt-16p, seed2 before seed10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def cpu_rows(data: Path) -> list[str]:
    """One table row per stored CPU set."""
    rows = []
    for name in sorted(set_names(data), key=_order):
        root = open_set(data, name)
        passes = 1 + sum(1 for p in root.glob("pass*") if p.is_dir())
        with contextlib.redirect_stdout(io.StringIO()):  # refit() narrates; only its summary
            s = refit(root)
        spread = (f"{_pct(s['own_spread_median_pct'])} / {_pct(s['own_spread_worst_pct'])}"
                  if s["own_spread_median_pct"] is not None else "-")
        rows.append(f"| {name} | {passes} | {_pct(s['median_abs_err_pct'])} / "
                    f"{_pct(s['worst_abs_err_pct'])} | {s['c1_ngram_al_within_3pct']} | "
                    f"{s['c1_suffix_al_within_10pct']} | {spread} | "
                    f"{s['errors_beyond_own_spread']} |")
    return rows


def gpu_sets(data: Path) -> list[Path]:
    """The H200 sets compare() reads: a launches.list or a study's trials_raw.csv."""
    return sorted((p for p in data.iterdir() if (p / "launches.list").exists()
                   or (p / "trials_raw.csv").exists()), key=lambda p: _order(p.name))


def gpu_rows(data: Path) -> list[str]:
    """One table row per stored H200 set and level: out-of-sample |error| of throughput."""
    rows = []
    for folder in gpu_sets(data):
        _, _, errors = compare(folder)
        for c in sorted(errors["plane"]):
            cells = []
            for model in ("line", "plane"):
                e = [abs(x) for x in errors[model].get(c, [])]
                cells.append(f"{statistics.median(e):.1f}% / {max(e):.1f}%" if e else "-")
            rows.append(f"| {folder.name} | {c} | {len(errors['plane'][c])} | "
                        f"{cells[0]} | {cells[1]} |")
    return rows


def drafter_sets(data: Path) -> list[Path]:
    """The drafter K-axis sets: folders with a launch per K (k<K>/result.json)."""
    return sorted((p for p in data.iterdir() if any(p.glob("k*/result.json"))),
                  key=lambda p: _order(p.name))


def _tput(r: dict, loaded: bool) -> str:
    if r["fitted"] or r["err_output_throughput_pct"] is None:
        return "-"
    return "not comparable" if loaded else f"{r['err_output_throughput_pct']:+.1f}%"


def drafter_table(data: Path) -> tuple[list[str], list[str]]:
    """One table row per drafter set, level and K up to the launched largest (predicted from
    it), and per set one line: how many out-of-sample K fall within the stated accuracy and
    within DRAFTER_GOAL_PCT, and the launches' wall time."""
    rows, notes = [], []
    for folder in drafter_sets(data):
        every = drafter_rows(folder)
        table = [r for r in every if r["scheme"] == "one_launch"]
        calibrated = {(r["concurrency"], r["k"]): r for r in every
                      if r["scheme"] == "calibrated_smallest_k"}
        loaded = folder.name in LOADED
        checked = [r for r in table if not r["fitted"] and r["meas_acceptance_length"]]
        for r in table:
            measured = r["meas_acceptance_length"]
            err = r["err_acceptance_length_pct"]
            within = ("-" if r["fitted"] or measured is None else
                      "yes" if abs(err) <= r["acceptance_accuracy_pct"] else "no")
            tput = _tput(r, loaded)
            cal = calibrated.get((r["concurrency"], r["k"]))
            tput_cal = _tput(cal, loaded) if cal is not None else "-"
            rows.append(
                f"| {folder.name} | {r['concurrency']} | {r['k']}"
                f"{' (launched)' if r['fitted'] else ''} | {r['pred_acceptance_length']:.3f} "
                f"({r['pred_acceptance_length_se']:.3f}) | "
                f"{'-' if measured is None else f'{measured:.3f}'} | "
                f"{'-' if r['fitted'] or err is None else f'{err:+.1f}%'} | "
                f"{r['acceptance_accuracy_pct']:.1f}% | {within} | {tput} | {tput_cal} |")
        stated = sum(abs(r["err_acceptance_length_pct"]) <= r["acceptance_accuracy_pct"]
                     for r in checked)
        goal = sum(abs(r["err_acceptance_length_pct"]) <= DRAFTER_GOAL_PCT for r in checked)
        source = table[0]["source_k"] if table else None
        launches = folder / "launches.json"
        walls = json.loads(launches.read_text())["wall_s"] if launches.is_file() else {}
        others = [f"K={k}: {walls[str(k)]:.0f} s" for k in sorted(int(k) for k in walls)
                  if k not in (0, source)]
        where = (f"not used by the prediction ({SEEN[folder.name]})" if folder.name in SEEN
                 else "out of sample")
        line = (f"- {folder.name}: {where}, {stated} of {len(checked)} predicted "
                f"acceptance lengths within the stated accuracy, {goal} of {len(checked)} "
                f"within {DRAFTER_GOAL_PCT:.0f}%.")
        out = [c for c in calibrated.values() if not c["fitted"]
               and c["err_output_throughput_pct"] is not None]
        if out and not loaded:
            near = sum(abs(c["err_output_throughput_pct"]) <= DRAFTER_TPUT_GOAL_PCT for c in out)
            line += (f" Throughput, the drafter's cost calibrated at the smallest K launched: "
                     f"{near} of {len(out)} out-of-sample K within "
                     f"{DRAFTER_TPUT_GOAL_PCT:.0f}% (errors "
                     f"{min(c['err_output_throughput_pct'] for c in out):+.1f}% to "
                     f"{max(c['err_output_throughput_pct'] for c in out):+.1f}%).")
        if str(source) in walls:
            line += (f" One launch at K={source} ({walls[str(source)]:.0f} s) covered K=1-"
                     f"{source}; the launches that check it: {', '.join(others)}.")
        if loaded:
            line += f" Throughput not comparable: {LOADED[folder.name]}."
        notes.append(line)
    return rows, notes


HEAD = f"""\
# Prediction accuracy on the stored data sets

How far the replay's predictions land from measured launches, per stored data set (CPU, H200,
and a model-based drafter's K axis on the CPU).
Generated by `benchmarks/accuracy_tables.py` from `benchmarks/data` with this checkout's predictor.
Regenerate it with `{COMMAND}`; a test checks the file equals that output.
"""

CPU = """\
## CPU (benchmarks/data/cpu-replay)

The embedded SmolLM2-135M-Instruct on the vLLM CPU build, 8 or 16 prompts x 64 output tokens,
c=1 and 4; how each set was measured: `benchmarks/data/cpu-replay/SOURCE.md`. The step cost is
fitted on the baseline and one calibration launch, as the replay strategy fits it. perf: the
|error| of output throughput and mean TPOT of the other 9 configs at both levels (36 errors per
set). AL: the mean acceptance length at c=1 against vLLM's counters. own spread: each config's
run-to-run spread (half the range of its runs over their median) where a set has several
passes, and how many perf errors exceed it. `benchmarks/replay_refit.py SET` prints every
figure behind a row.

| set | passes | perf median / worst | n-gram AL within 3% | suffix AL within 10% | own spread median / worst | errors beyond own spread |
|---|---|---|---|---|---|---|
"""

GPU = """\
## GPU (benchmarks/data/h200)

SmolLM2-135M-Instruct on vLLM 0.26.0 on an NVIDIA H200, instructcoder, 32 or 64 prompts x 128
output tokens, n-gram configs; how each set was measured: its `SOURCE.md`. Both step-cost models
are fitted on the aligned baseline and the calibration launches; the table gives the |error| of
output throughput over the configs neither model was fitted on. line: step = a + b x tokens
scored; plane: the same plus m where a step is not uniform (tuner.replay.cost: what the replay
strategy fits on an engine that logs a CUDA graph mode). Per config:
`benchmarks/stepcost_h200.py --data benchmarks/data/h200/SET`.

| set | c | configs | line median / worst | plane median / worst |
|---|---|---|---|---|
"""


DRAFTER = """\
## Drafter K axis, CPU (benchmarks/data/cpu-drafter-k)

The embedded SmolLM2-135M-Instruct on the vLLM CPU build with a made drafter (the same weights
without some layers: a layer-skipping self-draft, not a trained drafter), instructcoder, c=1
and 4; how each set was measured: its `SOURCE.md`. One launch at the largest K gives the
per-position acceptance from which every smaller K's acceptance length is predicted
(tuner.replay.drafter_k); launches at some smaller K check it. predicted (SE): the mean
acceptance length and its standard error; measured: vLLM's counters at a launch at that K;
allowed: the accuracy the prediction states (from the counts); within: the error inside it.
tok/s error: the predicted throughput against the launch at that K, from the one launch (the
drafter's cost per step not calibrated) and calibrated by the launch at the smallest K, where
the launches can be compared at all.
`benchmarks/drafter_k.py analyze SET` prints every figure, throughput included.

| set | c | K | predicted (SE) | measured | error | allowed | within | tok/s error, one launch | tok/s error, calibrated |
|---|---|---|---|---|---|---|---|---|---|
"""


def markdown(data: Path = DATA) -> str:
    """The whole document."""
    rows, notes = drafter_table(data / "cpu-drafter-k")
    return "\n".join([HEAD, CPU + "\n".join(cpu_rows(data / "cpu-replay")) + "\n",
                      GPU + "\n".join(gpu_rows(data / "h200")) + "\n",
                      DRAFTER + "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.parse_args()
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
