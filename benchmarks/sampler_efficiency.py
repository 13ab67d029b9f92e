"""Engine launches needed to reach the best config of an exhaustively measured grid:
our default sampler (TPE) against random search, median over several seeds.

The grid is measured once, for real, by `tuner optimize --sampler grid` (every config of the
space is one stored trial). This script then replays searches against those stored values,
so each simulated "launch" costs nothing: a sampler proposes a config, we look up its stored
measurement, and count distinct configs (a config proposed again is answered from storage,
as `tuner optimize` does) until the grid's best config (highest output throughput at the
target concurrency) has been proposed.

    tuner optimize --space ngram --sampler grid --n-trials 1000 --concurrency 1 ... --output-dir outputs/grid
    .venv/bin/python benchmarks/sampler_efficiency.py outputs/grid [--seeds 11]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import optuna


def table(study_dir: Path) -> tuple[dict[str, float], str, int, object]:
    from tuner.search import space as spaces
    from tuner.search import study as st

    study = st.open_existing(study_dir)
    meta = st.settings_of(study)
    sp = spaces.load(meta.space)
    values: dict[str, float] = {}
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        key = t.user_attrs.get("key")
        if key and "duplicate_of" not in t.user_attrs:
            values.setdefault(key, t.values[0])
    grid = {sp.config_from_params(p).key() for p in sp.grid()}
    missing = grid - set(values)
    if missing:
        raise SystemExit(f"{len(missing)} of {len(grid)} grid configs are not measured in "
                         f"{study_dir}; finish the grid study first.")
    best = max(grid, key=lambda k: values[k])
    return values, best, len(grid), sp


def launches_to_best(sampler: optuna.samplers.BaseSampler, values: dict[str, float],
                     best: str, sp, limit: int) -> int:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen: set[str] = set()
    for _ in range(limit * 20):
        trial = study.ask()
        key = sp.suggest(trial).key()
        study.tell(trial, values[key])
        seen.add(key)
        if key == best:
            return len(seen)
        if len(seen) >= limit:
            break
    return limit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--seeds", type=int, default=11)
    args = ap.parse_args()
    from tuner.search.samplers import quiet_optuna

    quiet_optuna()
    values, best, n, sp = table(args.study_dir)
    results = {}
    for name, make in (("tpe (default)", lambda s: optuna.samplers.TPESampler(
                           seed=s, multivariate=True, group=True, n_startup_trials=5)),
                       ("random", lambda s: optuna.samplers.RandomSampler(seed=s))):
        results[name] = [launches_to_best(make(seed), values, best, sp, n)
                         for seed in range(args.seeds)]
    print(f"# grid: {n} configs of space '{sp.name}' measured in {args.study_dir}; best: {best}")
    print(f"# {args.seeds} seeds; launches = distinct configs until the best is proposed")
    print(f"{'sampler':14} {'median':>7} {'min':>5} {'max':>5}   per seed")
    for name, xs in results.items():
        print(f"{name:14} {statistics.median(xs):7.1f} {min(xs):5d} {max(xs):5d}   {xs}")
    ratio = statistics.median(results["random"]) / statistics.median(results["tpe (default)"])
    print(f"random / tpe median launches: {ratio:.2f}")


if __name__ == "__main__":
    main()
