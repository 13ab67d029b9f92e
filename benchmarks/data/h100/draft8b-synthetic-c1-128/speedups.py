"""The trade-off table of this set: the draft config's speedup over the plain baseline per level,
with its 95% interval, from the study's two launches of each (the study's trial and the policy
ladder's run, both sending the one request schedule), and the verified policy beside it.

    .venv/bin/python benchmarks/data/h100/draft8b-synthetic-c1-128/speedups.py

The interval is tuner.intervals.speedup's: the between-launch spread pooled over both configs
(2 degrees of freedom) plus the paired spread of the per-window log ratio (windows hold the same
requests in every launch), Welch degrees of freedom. SYNTHETIC acceptance: vLLM's synthetic
rejection sampler, at SmolLM2-135M's measured n-gram rates (SOURCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))

from tuner import intervals  # noqa: E402
from tuner.search import ladder  # noqa: E402
from tuner.search import study as st  # noqa: E402


def launches(study) -> dict[str, list[dict]]:
    """Each config's launches (result dicts) by role: baseline, draft (k=3), policy."""
    out: dict[str, list[dict]] = {"baseline": [], "draft": [], "policy": []}
    for t in study.get_trials(deepcopy=False):
        r = t.user_attrs.get("result")
        if r:
            out["baseline" if st.is_baseline(t) else "draft"].append(r)
    for run in ladder.stored_runs(study):
        if run.result is not None:
            out[{"baseline": "baseline", "leader": "draft"}.get(run.role, run.role)].append(
                run.result.model_dump(mode="json"))
    return out


def level(result: dict, c: int) -> dict:
    return next(lv for lv in result["levels"] if lv["concurrency"] == c)


def main() -> None:
    study = st.open_existing(HERE, None, None)
    runs = launches(study)
    levels = [lv["concurrency"] for lv in runs["baseline"][0]["levels"]]
    print("c | baseline tok/s (2 launches) | draft k=3 tok/s (2) | speedup, 95% interval | "
          "decision | acceptance length | policy tok/s (1) | policy speedup, 95% interval | "
          "policy acceptance length")
    for c in levels:
        base = [level(r, c) for r in runs["baseline"]]
        draft = [level(r, c) for r in runs["draft"]]
        pol = [level(r, c) for r in runs["policy"]]
        tb, td = [b["output_throughput"] for b in base], [d["output_throughput"] for d in draft]
        tp = [p["output_throughput"] for p in pol]
        pool = intervals.Pool.of([tb, td])  # the two configs launched twice each

        def windows(side: list[dict]) -> list[tuple]:
            return [(lv["prompts_digest"], lv["windows"]) for lv in side]

        iv = intervals.speedup(td, tb, pool=pool,
                               within=intervals.Within.paired(windows(draft), windows(base)))
        ip = intervals.speedup(tp, tb, pool=pool,
                               within=intervals.Within.paired(windows(pol), windows(base)))

        def al(side: list[dict]) -> str:
            return " ".join(f"{lv['spec_decode_acceptance_length']:.2f}" for lv in side
                            if lv.get("spec_decode_acceptance_length"))

        def text(i: intervals.Interval | None) -> str:
            return f"{i.point:.2f}x [{i.lo:.2f}, {i.hi:.2f}] (df {i.df})" if i else "-"

        print(f"{c} | {' '.join(f'{x:.1f}' for x in tb)} | {' '.join(f'{x:.1f}' for x in td)} | "
              f"{text(iv)} | {intervals.decide(iv) if iv else '-'} | {al(draft)} | "
              f"{' '.join(f'{x:.1f}' for x in tp) or '-'} | {text(ip)} | {al(pol) or '-'}")
    digests = {level(r, c)["prompts_digest"] for r in runs["baseline"] + runs["draft"]
               + runs["policy"] for c in levels}
    print(f"request digests over every launch and level: {len(digests)} distinct "
          f"(one per level: {len(levels)})")


if __name__ == "__main__":
    main()
