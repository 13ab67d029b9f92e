"""Is the answer right, and the same twice? Runs the README main job under several prompt
orders (--seed), then `tuner verify --launches N` on each study (the pick and the baseline
launched again, interleaved, on prompts the study never sent), and prints per (run, level):
the choice, the pick and its equivalent set, the stated interval and its width, the measured
out-of-sample speedup, and whether the range expected of the check's fresh prompts (the
stated interval widened by their own spread and the check's launches' noise) and the stated
interval itself cover it. Then, per level: coverage, the
same decision across runs, the median width; and each study's wall time.

    python benchmarks/selection_calibration.py --seeds 0,1,2,3,4 --launches 3 \\
        --root /tmp/selection-calibration --out benchmarks/data/cpu-selection

The studies are written under --root (outside the checkout); the table and the figures go to
--out as calibration.json. Each study and its check run one after the other on this host, so
every number shares the host's load at the time (a 2-core host: see SOURCE.md there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

MAIN_JOB = ["optimize", "--workload", "instructcoder", "--n-trials", "6", "--num-prompts", "16",
            "--output-len", "64", "--concurrency", "1,4", "--requests-per-slot", "2", "-q"]


def _tuner(*args: str) -> tuple[int, float, str]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True,
                          text=True)
    return proc.returncode, time.monotonic() - t0, proc.stdout + proc.stderr


def _run(seed: int, root: Path, launches: int) -> dict:
    study = root / f"seed-{seed}"
    rc, study_s, out = _tuner(*MAIN_JOB, "--seed", str(seed), "--output-dir", str(study))
    if rc != 0:
        return {"seed": seed, "error": f"optimize exited {rc}: {out[-800:]}"}
    rc, verify_s, vout = _tuner("verify", str(study), "--launches", str(launches))
    recs = json.loads((study / "recommendation.json").read_text())
    checked = json.loads((study / "verify.json").read_text()) if (study / "verify.json"
                                                                  ).is_file() else {}
    launches_used = sum(1 for p in (study / "trials").iterdir() if p.is_dir())
    return {"seed": seed, "study_s": study_s, "verify_s": verify_s, "verify_rc": rc,
            "launches": launches_used, "levels": _levels(recs, checked),
            "verify_tail": vout[-600:] if rc else ""}


def _levels(recs: dict, checked: dict) -> list[dict]:
    by_level = {(c.get("target") or {}).get("concurrency"): c
                for c in checked.get("levels", [])}
    out = []
    for rec in recs.get("levels", []):
        sel = (rec.get("verdict") or {}).get("selection") or {}
        c = rec.get("concurrency")
        check = by_level.get(c, {})
        lo, hi = (rec.get("speedup_interval") or (None, None))
        out.append({
            "concurrency": c, "status": rec.get("status"), "choice": sel.get("choice"),
            "rests_on": sel.get("rests_on"), "pick": sel.get("subject") or rec.get("label"),
            "equivalent": sel.get("equivalent_total"),
            "equivalent_labels": sel.get("equivalent") or [],
            "stated": sel.get("speedup", rec.get("speedup_throughput")), "lo": lo, "hi": hi,
            "width": hi / lo if lo and hi else None,
            "measured": check.get("measured_speedup"), "outcome": check.get("outcome"),
            "stated_outcome": check.get("stated_outcome") or check.get("outcome"),
            "expected": check.get("expected_interval")})
    return out


def _summary(runs: list[dict]) -> list[str]:
    rows = [dict(lv, seed=r["seed"]) for r in runs if "levels" in r for lv in r["levels"]]
    lines = [f"{'seed':>4} {'c':>3} {'choice':<10} {'pick':<44} {'eq':>3} {'stated':>7} "
             f"{'interval':>13} {'width':>6} {'measured':>8} {'outcome':<8}"]
    for r in rows:
        iv = f"{r['lo']:.2f}-{r['hi']:.2f}" if r["lo"] else "-"
        lines.append(
            f"{r['seed']:>4} {r['concurrency']:>3} {str(r['choice']):<10} "
            f"{str(r['pick'])[:44]:<44} {str(r['equivalent'] or 0):>3} "
            f"{_x(r['stated']):>7} {iv:>13} {_x(r['width']):>6} {_x(r['measured']):>8} "
            f"{str(r['outcome']):<8}")
    for c in sorted({r["concurrency"] for r in rows}):
        mine = [r for r in rows if r["concurrency"] == c]
        judged = [r for r in mine if r["outcome"] in ("inside", "above", "below")]
        covered = sum(r["outcome"] == "inside" for r in judged)
        by_stated = sum(r["stated_outcome"] == "inside" for r in judged)
        choices = [r["choice"] for r in mine]
        common = max(set(choices), key=choices.count) if choices else None
        agree, anchor = _same_decision(mine)
        widths = [r["width"] for r in mine if r["width"]]
        lines.append(f"c={c}: the out-of-sample speedup lies in the range expected of the "
                     f"check's fresh prompts in {covered} of {len(judged)} runs, in the stated "
                     f"interval itself in {by_stated}; the same choice ({common}) in "
                     f"{choices.count(common)} of {len(mine)}; the same decision (that choice, "
                     f"every pick within seed {anchor}'s equivalent set) in {agree} of "
                     f"{len(mine)}; median width "
                     f"{_x(statistics.median(widths)) if widths else '-'} (hi/lo)")
    times = [r["study_s"] for r in runs if "study_s" in r]
    if times:
        lines.append(f"main job wall time: median {statistics.median(times) / 60:.1f} min "
                     f"(range {min(times) / 60:.1f}-{max(times) / 60:.1f}), launches "
                     f"{[r.get('launches') for r in runs]}")
    return lines


def _same_decision(rows: list[dict]) -> tuple[int, int | None]:
    """The most runs that made one run's decision: the same choice and, where it is "on", a
    pick inside that run's equivalent set (its pick and every config within the indifference
    zone of it). Returns the count and the run it is counted against."""
    best, anchor = 0, None
    for a in rows:
        chosen = {a["pick"], *a["equivalent_labels"]}
        agree = sum(b["choice"] == a["choice"] and (a["choice"] != "on" or b["pick"] in chosen)
                    for b in rows)
        if agree > best:
            best, anchor = agree, a["seed"]
    return best, anchor


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def recheck(root: Path) -> list[str]:
    """Each stored study's `tuner verify` result (ROOT/seed-N/verify.json) judged again with
    this checkout's analysis: the range expected of the check's fresh prompts beside the
    stated interval (for runs whose verify predates that range)."""
    from tuner.analysis import verification as checking
    from tuner.records.verification import VerifyLaunch, VerifyTarget

    lines = [f"{'study':<8} {'c':>3} {'stated':>11} {'expected':>11} {'measured':>8} "
             f"{'stated says':<11} {'expected says':<13} {'fresh sd':>8} {'launch sd':>9}"]
    for study in sorted(root.glob("seed-*")):
        try:
            rec = json.loads((study / "recommendation.json").read_text())
            ver = json.loads((study / "verify.json").read_text())
        except OSError:
            continue
        launches = [VerifyLaunch.model_validate(x) for x in ver["launches"]]
        checked = {lv["target"]["concurrency"]: lv for lv in ver["levels"]}
        for lv in rec["levels"]:
            sel = (lv.get("verdict") or {}).get("selection") or {}
            old = checked.get(lv["concurrency"])
            if not old or old["outcome"] == "skipped":
                continue
            target = VerifyTarget.model_validate(old["target"])
            if sel.get("rests_on") in ("replay", "scaled") and sel.get("sample_prompts"):
                target = target.model_copy(update={k: sel[k] for k in (
                    "sample_sd", "sample_prompts", "cost_sd", "cost_df")})
            c = checking.check(target, launches, requests=old["requests"])
            lo, hi = target.stated_interval
            e = c.expected_interval
            lines.append(
                f"{study.name:<8} {lv['concurrency']:>3} {lo:>5.2f}-{hi:<5.2f} "
                f"{f'{e[0]:.2f}-{e[1]:.2f}' if e else '-':>11} {_x(c.measured_speedup):>8} "
                f"{(c.stated_outcome or c.outcome).value:<11} {c.outcome.value:<13} "
                f"{_x(c.fresh_sd):>8} {_x(c.launch_sd):>9}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recheck", type=Path, default=None, metavar="ROOT",
                   help="judge the stored studies under ROOT again (no launch) and exit")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--root", type=Path, default=Path("/tmp/selection-calibration"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.recheck is not None:
        print("\n".join(recheck(args.recheck)))
        return
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        runs.append(_run(seed, args.root, args.launches))
        print(f"seed {seed} done: {json.dumps(runs[-1])[:300]}", flush=True)
    lines = _summary(runs)
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "calibration.json").write_text(json.dumps(
            {"runs": runs, "summary": lines}, indent=1) + "\n")


if __name__ == "__main__":
    main()
