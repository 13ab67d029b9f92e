"""Intervals: how sure a speedup measured over a few engine launches is, one rule for the
search (when the replay strategy's confirm launches may stop) and the analysis (what a
recommendation claims).

Each launch of a config at a level gives one throughput; speedups are ratios, so they are
worked in log space. The between-launch variance of the log throughput is pooled over every
config of the level launched at least twice (degrees of freedom: the sum of n - 1), and the
speedup of A over B is exp(mean log A - mean log B) with a Student-t interval whose standard
error is s_pooled * sqrt(1/nA + 1/nB). A decision reads the interval against 1.00x and an
equivalence margin: above, below, equivalent (inside 1 +- margin) or still open.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

CONFIDENCE = 0.95  # --confidence 95
# --margin 2: closer to 1.00x than this is no difference that matters, and configs this close
# to each other are one choice (tuner.replay.selection's indifference zone)
MARGIN = 0.02
# A config launched once has no spread of its own: its interval borrows the pooled one, but
# only once the others give it at least this many degrees of freedom.
ONE_LAUNCH_DF = 2

Decision = Literal["above", "below", "equivalent", "open"]
ABOVE: Decision = "above"
BELOW: Decision = "below"
EQUIVALENT: Decision = "equivalent"
OPEN: Decision = "open"


def percent(fraction: float) -> str:
    """0.95 -> "95%", 0.995 -> "99.5%" (as --confidence and --margin are typed)."""
    return f"{round(100 * fraction, 6):g}%"


@dataclass(frozen=True)
class Interval:
    """The speedup of A over B (`point`) and its two-sided `confidence` interval [lo, hi],
    from n_a and n_b launches and a pooled spread with `df` degrees of freedom."""

    point: float
    lo: float
    hi: float
    confidence: float
    n_a: int
    n_b: int
    df: int

    def bounds(self) -> str:
        """ "95% interval 1.08-1.16" """
        return f"{percent(self.confidence)} interval {self.lo:.2f}-{self.hi:.2f}"

    def text(self) -> str:
        """ "1.12x (95% interval 1.08-1.16; 3 and 3 launches)" """
        return f"{self.point:.2f}x ({self.bounds()}; {self.n_a} and {self.n_b} launches)"


@dataclass(frozen=True)
class Pool:
    """The between-launch SD of log throughput (close to a relative SD), pooled over the
    `configs` launched at least twice, with `df` degrees of freedom; 0 and 0 where none was."""

    sd: float = 0.0
    df: int = 0
    configs: int = 0

    @classmethod
    def of(cls, groups: Iterable[Sequence[float]]) -> Pool:
        """Pool the launches of each config (one sequence of throughputs per config)."""
        squares, df, configs = 0.0, 0, 0
        for group in groups:
            xs = logs(group)
            if len(xs) >= 2:
                mean = sum(xs) / len(xs)
                squares += sum((x - mean) ** 2 for x in xs)
                df += len(xs) - 1
                configs += 1
        return cls(sd=math.sqrt(squares / df) if df else 0.0, df=df, configs=configs)

    def text(self) -> str:
        """ "between-launch SD 3.1% pooled over 4 configs (6 degrees of freedom)" """
        return (f"between-launch SD {self.sd:.1%} pooled over {self.configs} config(s) "
                f"({self.df} degrees of freedom)")


# One launch's windows at a level (LevelMetrics.windows) with the digest of the requests they
# hold (LevelMetrics.prompts_digest): window j of two launches with one digest hold the same
# requests.
LaunchWindows = tuple[str | None, Sequence[float]]


@dataclass(frozen=True)
class Within:
    """The paired within-level spread of a speedup's log: the SD over the level's fixed windows
    of log(A's window throughput) - log(B's), each side averaged over its launches, window j
    holding the same requests on both sides (tuner.measure.windows), over sqrt(windows); with
    windows - 1 degrees of freedom. It is what another sample of the workload's prompts (and
    the engine within a launch) would move the speedup by, which the between-launch spread of
    launches sending the same requests does not hold."""

    se: float
    df: int

    @classmethod
    def paired(cls, a: Iterable[LaunchWindows], b: Iterable[LaunchWindows]) -> Within | None:
        """From each side's launches (digest, windows); None where no launches of the two share
        one digest and one window count of at least 2, or a window holds no positive figure."""
        a, b = list(a), list(b)
        for digest, _ in b:
            if digest is None:
                continue
            sides = [[w for d, w in side if d == digest] for side in (a, b)]
            counts = {len(w) for side in sides for w in side}
            if not all(sides) or len(counts) != 1 or (n := counts.pop()) < 2:
                continue
            means = [[_mean_log([w[j] for w in side]) for j in range(n)] for side in sides]
            if any(m is None for side in means for m in side):
                return None
            diffs = [x - y for x, y in zip(means[0], means[1], strict=True)]
            mean = sum(diffs) / n
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
            return cls(se=sd / math.sqrt(n), df=n - 1)
        return None


def _mean_log(values: Sequence[float]) -> float | None:
    xs = logs(values)
    return sum(xs) / len(xs) if len(xs) == len(values) and xs else None


def logs(values: Iterable[float]) -> list[float]:
    """The logs of the measured throughputs (a missing, zero or negative figure is no
    measurement)."""
    return [math.log(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)
            and v > 0]


def enough(n: int, pool: Pool) -> bool:
    """Whether a config launched `n` times has an interval: twice, or once where the pool
    already holds ONE_LAUNCH_DF degrees of freedom from the others."""
    return pool.df >= 1 and (n >= 2 or (n == 1 and pool.df >= ONE_LAUNCH_DF))


def speedup(a: Sequence[float], b: Sequence[float], *, pool: Pool,
            confidence: float = CONFIDENCE, within: Within | None = None) -> Interval | None:
    """A's speedup over B (throughputs of their launches) with its interval from `pool`, and,
    where given, the paired within-level spread `within` added (independent sources: the
    between-launch spread of launches that send the same requests holds none of the prompt
    sample's), degrees of freedom by Welch-Satterthwaite; None where either side has too few
    launches (`enough`)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence!r} must lie between 0 and 1 (0.95: 95%)")
    la, lb = logs(a), logs(b)
    if not (enough(len(la), pool) and enough(len(lb), pool)):
        return None
    diff = sum(la) / len(la) - sum(lb) / len(lb)
    between = pool.sd * math.sqrt(1 / len(la) + 1 / len(lb))
    se, df = between, float(pool.df)
    if within is not None and within.df >= 1 and within.se > 0:
        se = math.sqrt(between ** 2 + within.se ** 2)
        df = se ** 4 / (between ** 4 / pool.df + within.se ** 4 / within.df)
    half = t_quantile(0.5 + confidence / 2, df) * se
    return Interval(point=math.exp(diff), lo=math.exp(diff - half), hi=math.exp(diff + half),
                    confidence=confidence, n_a=len(la), n_b=len(lb), df=round(df))


def decide(interval: Interval, margin: float = MARGIN) -> Decision:
    """"equivalent" (inside 1 - margin .. 1 + margin: either will do, even where it also
    excludes 1.00x, as two identical-looking launches each do), else "above" (lo > 1),
    "below" (hi < 1) or "open" (more launches needed)."""
    if margin < 0:
        raise ValueError(f"margin {margin!r} must not be negative (0.02: within 2%)")
    if 1 - margin <= interval.lo and interval.hi <= 1 + margin:
        return EQUIVALENT
    if interval.lo > 1:
        return ABOVE
    if interval.hi < 1:
        return BELOW
    return OPEN


class RankingStatus(str, Enum):
    """Where a ranking by speedup intervals stands."""

    DECIDED = "decided"  # every comparison it rests on is above, below or equivalent
    OPEN = "open"  # a comparison's interval holds 1.00x and reaches beyond the margin
    FEW_LAUNCHES = "few_launches"  # a config has too few launches for an interval (`enough`)
    NO_LEADER = "no_leader"  # no leader is left to rank


@dataclass(frozen=True)
class Speedup:
    """A config's speedup over another, by the config's label; None: too few launches."""

    label: str
    interval: Interval | None


@dataclass(frozen=True)
class Compared:
    """One comparison a ranking rests on: A's speedup over B and what it says at the margin."""

    a: str
    b: str
    interval: Interval | None
    decision: Decision


@dataclass(frozen=True)
class Ranking:
    """Leaders and baselines ranked by their launches at one level (the replay strategy's
    confirm launches stop on it; tuner.outputs.ranking says it), figures only: the `status`;
    with FEW_LAUNCHES, the config short of launches and how many it has; else the plain
    baseline's label, the comparisons (the best leader against the plain baseline, and the
    first against the runner-up where they are others), each ranked config over the plain
    baseline (best first; `first` None where the plain baseline leads), the pooled spread,
    and where an aligned baseline was measured, its speedup over the plain one (`path`) and
    each leader's over it (`gains`)."""

    status: RankingStatus
    concurrency: int
    margin: float
    short_of: str = ""
    launches: int = 0
    plain: str = ""
    best: Speedup | None = None
    first: Speedup | None = None
    pairs: tuple[Compared, ...] = ()
    over_plain: tuple[Speedup, ...] = ()
    pool: Pool | None = None
    path: Speedup | None = None
    gains: tuple[Speedup, ...] = ()

    @property
    def decided(self) -> bool:
        return self.status == RankingStatus.DECIDED


# --- Student's t, exact: the regularised incomplete beta function -------------------------


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with `df` degrees of freedom (t_quantile(0.975, 4) =
    2.776), by bisection on the exact distribution function."""
    if not 0 < p < 1 or not df > 0:
        raise ValueError(f"t quantile: p={p!r} must lie in (0, 1) and df={df!r} be positive")
    if p <= 0.5:
        return 0.0 if p == 0.5 else -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * beta_regularized(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def beta_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function (continued fraction, Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 1000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            out *= d * c
        if abs(d * c - 1) < eps:
            break
    return out
