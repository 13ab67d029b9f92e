"""Search stage, the replay strategy's candidates: which configs of a space are replayed
(every grid point of a method, or a seeded sample of a large or continuous one, the space's
start points always), and the climb that searches a sampled grid around the predicted leaders
(`refine`). Pure: no engine, no storage.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.records.configs import TrialConfig
from tuner.records.decisions import Unreplayable
from tuner.records.predictions import PredictedRow
from tuner.replay import acceptance
from tuner.replay.predict import Prediction
from tuner.search.space import Param, Point, SearchSpace, Value
from tuner.tokens import TokenCapture

GRID_LIMIT = 4000  # n-gram's whole default space is 160 points
SAMPLED_POINTS = 48  # per method whose space is continuous or larger than GRID_LIMIT
# A suffix replay steps arctic-inference's cache from Python, about 11 us per output token
# (0.33 s per config over the 29k tokens of an H200 capture): 24 sampled points, then `refine`.
SUFFIX_POINTS = 24


def why_not_replayable(space: SearchSpace, *, rates: list[float] | None) -> Unreplayable | None:
    """None when every candidate of `space` can be predicted by replay, else why not."""
    other = [m for m in space.speculative_methods() if m not in acceptance.REPLAYABLE]
    if other:
        return Unreplayable(why="methods", methods=tuple(other),
                            replayable=tuple(acceptance.REPLAYABLE))
    if any(isinstance(p, Param) for p in space.engine.values()):
        return Unreplayable(why="engine_knobs")
    if rates:
        return Unreplayable(why="acceptance_profile")
    return None


def candidates(space: SearchSpace, *, seed: int = 0) -> list[TrialConfig]:
    """The configs to replay: every grid point of a method (n-gram: all 160), or a seeded
    sample where the method's grid is large or continuous, the space's start points always.
    A sampled grid is then searched around the predicted leaders (`refine`)."""
    rng = random.Random(seed)
    out: dict[str, TrialConfig] = {}
    for point in space.start_points:
        params = space.params_of(point)
        if params:
            cfg = space.config_from_params(params)
            out[cfg.key()] = cfg
    for method in space.speculative_methods():
        cap = SUFFIX_POINTS if method == "suffix" else GRID_LIMIT
        sub = only_method(space, method)
        points = grid_points(sub)
        if points is not None and len(points) <= cap:
            configs = [sub.config_from_params(p) for p in points]
        elif points is not None:  # a grid too large to replay whole: a sample of its points
            configs = [sub.config_from_params(p) for p in rng.sample(points, cap)]
        else:
            configs = [sub.suggest(_RandomTrial(rng)) for _ in range(
                min(cap, SAMPLED_POINTS) * 4)]
            rng.shuffle(configs)
        picked = 0
        for cfg in configs:
            if cfg.key() not in out and picked < cap:
                out[cfg.key()] = cfg
                picked += 1
    return list(out.values())


def neighbours(space: SearchSpace, configs: Iterable[TrialConfig]) -> list[TrialConfig]:
    """The grid points one step from `configs`: one knob moved to the next or the previous
    value of its domain, the others kept (methods whose grid cannot be enumerated have none)."""
    out: dict[str, TrialConfig] = {}
    grids: dict[str, _Grid | None] = {}
    for cfg in configs:
        method = cfg.method
        if method not in space.methods or method == "none":
            continue
        if method not in grids:
            grids[method] = _Grid.of(only_method(space, method))
        grid = grids[method]
        point = space.point_of(cfg)
        if grid is None or point is None or point not in grid.points:
            continue
        for name, domain in grid.domains.items():
            at = domain.index(point.value(name))
            for j in (at - 1, at + 1):
                if 0 <= j < len(domain):
                    moved = grid.points.get(point.with_value(name, domain[j]))
                    if moved is not None:
                        near = space.config_from_params(moved)
                        out.setdefault(near.key(), near)
    return list(out.values())


@dataclass(frozen=True)
class _Grid:
    """A method's grid: each point by itself (a point moved to a value equal to the grid's,
    3.0 for 3, is the grid's own point), and the sorted values of each searched key."""

    points: dict[Point, Point]
    domains: dict[str, list[Value]]

    @classmethod
    def of(cls, space: SearchSpace) -> _Grid | None:
        """The grid of a one-method space; None where it cannot be enumerated."""
        points = grid_points(space)
        if points is None:
            return None
        (method, block), = space.methods.items()
        return cls(points={p: p for p in points},
                   domains={name: sorted({p.value(name) for p in points})
                            for name, param in block.items() if isinstance(param, Param)})


REFINE_ROUNDS = 6  # hill-climbing rounds around the leaders; each replays a few dozen configs
REFINE_TOP = 2  # leaders per method and level whose neighbours are replayed
REFINE_MAX = 64  # configs the climb may add
# ... and at most this many captured output tokens replayed: a suffix replay costs ~11 us per
# token, twice where a config follows the calibration's token stream (tuner.replay.streams), so
# on an H200-size capture (29k tokens) the climb adds 20 configs, ~20 s; on the README's main
# job (1.3k tokens) REFINE_MAX.
REFINE_TOKENS = 600_000


def refine_limit(capture: TokenCapture) -> int:
    """How many configs the climb may add over `capture` (REFINE_MAX, fewer on large ones)."""
    tokens = sum(len(r.output) for r in capture.requests)
    return max(1, min(REFINE_MAX, REFINE_TOKENS // max(1, tokens)))


def refine(space: SearchSpace, configs: list[TrialConfig], pred: Prediction,
           predict_more: Callable[[list[TrialConfig]], Prediction], *, limit: int = REFINE_MAX
           ) -> tuple[list[TrialConfig], Prediction, int]:
    """Search the sampled grids (suffix: 24 of 1,536 points) around the predicted leaders:
    predict the grid neighbours of the REFINE_TOP best configs of each method at every level
    (`predict_more` predicts the configs it is given, from the same capture and trials), add
    them to the table, and repeat until no leader has an unpredicted neighbour (or
    REFINE_ROUNDS, or `limit` configs added: `refine_limit`). Needs a calibrated step cost (the
    leaders are by predicted throughput). Returns the configs, the table and how many configs it added.

    On the stored CPU sets the predicted suffix landscape is flat near its top: over two sets
    and three seeds the sample's best came within 1.5% of the whole grid's, the climb's within
    0.3%, after 37-64 more replays (3-7 s) against 85-96 s for the grid
    (benchmarks/suffix_sample.py). The climb is there for workloads whose top is not flat."""
    added = 0
    by_key = {c.key(): c for c in configs}  # the rows of `pred` are of these configs
    for _ in range(REFINE_ROUNDS):
        if not any(c.calibrated for c in pred.costs.values()):
            break
        # a drafter's K axis (tuner.replay.drafter_k) has rows of K the configs may not hold
        leaders = [by_key[r.key] for r in _leading_rows(pred) if r.key in by_key]
        fresh = [c for c in neighbours(space, leaders) if c.key() not in by_key]
        fresh = fresh[:limit - added]
        if not fresh:
            break
        by_key.update((c.key(), c) for c in fresh)
        configs = [*configs, *fresh]
        added += len(fresh)
        pred = pred.extended(predict_more(fresh))
    return configs, pred, added


def _leading_rows(pred: Prediction) -> list[PredictedRow]:
    """The REFINE_TOP best predicted rows of each method at every level."""
    leaders = []
    for level in sorted(pred.costs):
        ranked = pred.leaders(level, 10_000)
        for method in dict.fromkeys(r.method for r in ranked):  # best method first
            leaders += [r for r in ranked if r.method == method][:REFINE_TOP]
    return leaders


def only_method(space: SearchSpace, method: str) -> SearchSpace:
    return space.model_copy(update={"methods": {method: space.methods[method]}})


def grid_points(space: SearchSpace) -> list[Point] | None:
    """Every grid point, or None where the grid is continuous or larger than GRID_LIMIT."""
    try:
        return space.grid(limit=GRID_LIMIT)
    except ConfigError:
        return None


class _RandomTrial:
    """Just enough of an Optuna trial for SearchSpace.suggest to draw one random point."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def suggest_categorical(self, _name: str, choices: list[Any]) -> Any:
        return self.rng.choice(choices)

    def suggest_int(self, _name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        return low + step * self.rng.randint(0, (high - low) // step)

    def suggest_float(self, _name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        if step:
            return round(low + step * self.rng.randint(0, int(round((high - low) / step))), 10)
        return self.rng.uniform(low, high)


