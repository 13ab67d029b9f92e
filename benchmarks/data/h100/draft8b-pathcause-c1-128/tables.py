"""The tables of this set (issue 47): each launch's engine path from its log, and per level its
throughput, mean TPOT, median inter-chunk gap, drafts and acceptance length; then the cause:
static K=3 with piecewise graphs forced against the schedule and static K=3 as it runs, each
over the plain baseline of the same lease, with 95% intervals where a config has two launches;
last, the policy's answer now on the stored study it explains (../draft8b-synthetic-c1-128).

    .venv/bin/python benchmarks/data/h100/draft8b-pathcause-c1-128/tables.py > tables.txt

The interval is tuner.intervals.speedup's (the set h100/draft8b-synthetic-c1-128's
speedups.py uses the same): the between-launch spread pooled over the configs launched twice
(k3-pw, sched) plus the paired spread of the per-window log ratio (the windows hold the same
requests in every launch). SYNTHETIC acceptance (SOURCE.md).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))

from tuner import intervals  # noqa: E402

# (name in launches.list, what it is); launches of one config share the part before "-r2".
LAUNCHES = (("base", "plain baseline"),
            ("base-v1pw", "no speculation on the schedule's path (V1, no async, PIECEWISE)"),
            ("k3", "static K=3 as it runs"),
            ("k3-pw", "static K=3, cudagraph_mode PIECEWISE forced"),
            ("k3-pw-r2", "the same, second launch"),
            ("sched", "schedule [[1,63,3],[64,1024,0]]"),
            ("sched-r2", "the same, second launch"))
# The lines each launch's engine.log holds that decide its path (vLLM 0.26.0's wording).
PATH_LINES = re.compile(r"Overriding cudagraph_mode|using the V1 model runner|Using V2 Model "
                        r"Runner|Asynchronous scheduling is|Capturing CUDA graphs")


def result(name: str) -> dict:
    return json.loads((HERE / name / "result.json").read_text())


def level(res: dict, c: int) -> dict:
    return next(lv for lv in res["levels"] if lv["max_concurrency"] == c)


def paths() -> None:
    print("launch | what | engine start s | runner | async scheduling | cudagraph_mode | "
          "graphs captured (engine.log)")
    for name, what in LAUNCHES:
        res = result(name)
        d = res["engine"]["details"]
        log = (HERE / name / "engine.log").read_text()
        graphs = sorted({m.group(1) for m in re.finditer(r"Capturing CUDA graphs \(([^)]*)\)",
                                                          log)})
        print(f"{name} | {what} | {res['engine']['start_s']:.0f} | {d['model_runner']} | "
              f"{d['async_scheduling']} | {d['cudagraph_mode']} | {'; '.join(graphs)}")
    print()
    print("The lines (engine.log; each once, the API server's and the engine core's alike):")
    for name, _ in LAUNCHES:
        seen = set()
        for line in (HERE / name / "engine.log").read_text().splitlines():
            if PATH_LINES.search(line) is None:
                continue
            text = re.sub(r"^\([^)]*\) (?:\w+ [\d-]+ [\d:]+ \[[^]]*\] )?", "", line)
            if text not in seen:
                seen.add(text)
                print(f"  {name}: {text[:160]}")


def per_level() -> None:
    levels = [lv["max_concurrency"] for lv in result("base")["levels"]]
    print("c | launch | tok/s | x base | mean TPOT ms | median chunk gap ms | drafts | "
          "acceptance length | windows spread %")
    base = {c: level(result("base"), c)["output_throughput"] for c in levels}
    for c in levels:
        for name, _ in LAUNCHES:
            lv = level(result(name), c)
            al = lv.get("spec_decode_acceptance_length")
            print(f"{c} | {name} | {lv['output_throughput']:.1f} | "
                  f"{lv['output_throughput'] / base[c]:.2f} | {lv['mean_tpot_ms']:.1f} | "
                  f"{lv['median_itl_ms']:.1f} | {lv['spec_decode_num_drafts']:.0f} | "
                  f"{'-' if al is None else f'{al:.2f}'} | {lv['stability_pct']:.1f}")


GROUPS = {"base": ["base"], "base-v1pw": ["base-v1pw"], "k3": ["k3"],
          "k3-pw": ["k3-pw", "k3-pw-r2"], "sched": ["sched", "sched-r2"]}


def side(key: str, c: int) -> list[dict]:
    """Level `c` of every launch of one config."""
    return [level(result(n), c) for n in GROUPS[key]]


def ratio(a: str, b: str, c: int) -> str:
    """Config `a` over config `b` at level `c`, with its 95% interval (the between-launch
    spread pooled over the two configs launched twice)."""
    tp = {k: [lv["output_throughput"] for lv in side(k, c)] for k in (a, b, "k3-pw", "sched")}
    pool = intervals.Pool.of([tp["k3-pw"], tp["sched"]])
    within = intervals.Within.paired(
        [(lv["prompts_digest"], lv["windows"]) for lv in side(a, c)],
        [(lv["prompts_digest"], lv["windows"]) for lv in side(b, c)])
    iv = intervals.speedup(tp[a], tp[b], pool=pool, within=within)
    if iv is None:
        return f"{sum(tp[a]) / len(tp[a]) / (sum(tp[b]) / len(tp[b])):.2f}x (no interval)"
    return f"{iv.point:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}]"


def cause() -> None:
    levels = [lv["max_concurrency"] for lv in result("base")["levels"]]
    print("c | K=3 as it runs / base | K=3 piecewise / base | schedule / base | "
          "base on the schedule's path / base | schedule / K=3 piecewise | "
          "schedule / K=3 as it runs")
    for c in levels:
        print(f"{c} | {ratio('k3', 'base', c)} | {ratio('k3-pw', 'base', c)} | "
              f"{ratio('sched', 'base', c)} | {ratio('base-v1pw', 'base', c)} | "
              f"{ratio('sched', 'k3-pw', c)} | {ratio('sched', 'k3', c)}")


def policy() -> None:
    """tuner policy's rules on the stored study's ladder and verify runs, as tuner.api runs
    them: before any launch (the path rule from the leader's logged path), and on its verify
    launch (the engine path, drafts per band, speed against static K)."""
    from tuner.analysis import policy as rules
    from tuner.analysis.ladder_stats import engine_details
    from tuner.analysis.schedule_verification import with_verification
    from tuner.measure import enginepath
    from tuner.outputs import policy_words
    from tuner.search import ladder
    from tuner.search import study as st
    from tuner.speculative.schedule_rules import schedule_path, varying_k

    with tempfile.TemporaryDirectory() as tmp:  # a copy: opening a study writes beside it
        shutil.copy(HERE.parent / "draft8b-synthetic-c1-128" / "study.journal", tmp)
        runs = ladder.stored_runs(st.open_existing(Path(tmp)))
    lad = [r for r in runs if r.phase == "ladder"]
    lineup = list({r.key: (r.role, r.config) for r in lad}.values())
    leader = next(c for role, c in lineup if role == "leader")
    path = engine_details(lad, leader.key())
    rule = schedule_path(leader.method, runner=path.get("model_runner"),
                         cudagraph_mode=path.get("cudagraph_mode"))
    before = rules.draft_policy(lad, lineup, max_batch=1024, where="-",
                                varying_k=varying_k(leader.method), path_rule=rule)
    print(f"Before any launch (the leader ran {path.get('model_runner')}, "
          f"{path.get('cudagraph_mode')}): {policy_words.worded(before).headline}")
    drafted = rules.draft_policy(lad, lineup, max_batch=1024, where="-",
                                 varying_k=varying_k(leader.method))
    policy_cfg, static = rules.policy_configs(drafted, lineup)
    after = policy_words.worded(with_verification(
        drafted, runs, policy_cfg=policy_cfg, static=static, side_by_side=False,
        path_fields=enginepath.FIELDS))
    print(f"On its verify launch: {after.verdict}")
    for line in after.fallback_bands or ():
        print(f"  router band: {line}")


def main() -> None:
    print((HERE / "gpu.txt").read_text().strip())
    print()
    paths()
    print()
    per_level()
    print()
    cause()
    print()
    policy()


if __name__ == "__main__":
    main()
