"""The replay strategy's ranking in words: the line said by default ("decided at c=4: first X
1.12x (95% interval 1.08-1.16; 3 and 3 launches)"), every figure with -v and in the report,
from the figures of its record (tuner.intervals.Ranking, which the search decides).
"""

from __future__ import annotations

from collections.abc import Callable

from tuner import intervals
from tuner.intervals import Compared, Interval, Ranking, RankingStatus


def short(r: Ranking) -> str:
    """The ranking in one line: decided (who is first), or what keeps it open."""
    at = f"c={r.concurrency}"
    if r.status == RankingStatus.FEW_LAUNCHES:
        return (f"undecided at {at}: {r.short_of} has {r.launches} launch(es); an interval "
                "needs 2, or 1 once the others were launched twice "
                f"({intervals.ONE_LAUNCH_DF} degrees of freedom pooled)")
    if r.status == RankingStatus.NO_LEADER:
        return f"undecided at {at}: no leader is left to rank"
    if r.status == RankingStatus.OPEN:
        return f"undecided at {at}: " + "; ".join(
            _compared(c, r.margin) for c in r.pairs if c.decision == intervals.OPEN)
    assert r.best is not None  # a decided ranking has a best leader
    lead = (f"{r.first.label} {_iv_text(r.first.interval)}" if r.first is not None
            else f"{r.plain}; best speculative {r.best.label} {_iv_text(r.best.interval)}")
    same = "".join(f"; {c.a} and {c.b} within \u00b1{intervals.percent(r.margin)}: either will "
                   "do" for c in r.pairs if c.decision == intervals.EQUIVALENT)
    return f"decided at {at}: first {lead}{same}"


def full(r: Ranking) -> str:
    """Every figure the ranking rests on; "" where the short line says it all."""
    if r.status in (RankingStatus.FEW_LAUNCHES, RankingStatus.NO_LEADER):
        return ""
    assert r.pool is not None  # a ranking with comparisons pooled their spread
    figures = "; ".join(f"{s.label} {_iv_text(s.interval)}" for s in r.over_plain)
    text = "; ".join(_compared(c, r.margin) for c in r.pairs)
    text += f". Over the plain baseline: {figures}; {r.pool.text()}"
    if r.path is not None:
        gains = ", ".join(f"{g.label} {_iv_text(g.interval)}" for g in r.gains)
        text += (f"; engine path {_iv_text(r.path.interval)} (aligned over plain baseline), "
                 f"speculation alone (over the aligned baseline): {gains}")
    return f"{'decided' if r.decided else 'undecided'} at c={r.concurrency}: {text}"


def say_ranking(r: Ranking, *, say: Callable[[str], None], detail: Callable[[str], None],
                note: Callable[..., None]) -> None:
    """The ranking in one line through `say`, every interval through `detail` (-v), and the
    whole of it noted for the report's "How it was decided"."""
    line, figures = short(r), full(r)
    if not figures:  # "undecided at c=4: X has 1 launch; ..."
        say(f"Ranking {line}.")
    else:
        say(f"Ranking {line}; every figure: -v or the report.")
        detail(f"Ranking {figures}.")
    note("confirmation", f"Ranking {figures or line}.", "ranking")


def _compared(c: Compared, margin: float) -> str:
    """One comparison in words: "X beats Y: 1.12x (95% interval 1.08-1.16; ...)"."""
    said = _iv_text(c.interval)
    if c.decision == intervals.ABOVE:
        return f"{c.a} beats {c.b}: {said}"
    if c.decision == intervals.BELOW:
        return f"{c.a} trails {c.b}: {said}"
    if c.decision == intervals.EQUIVALENT:
        return (f"{c.a} and {c.b} are within \u00b1{intervals.percent(margin)} (either will "
                f"do): {said}")
    return f"{c.a} against {c.b} is open: {said}"


def _iv_text(iv: Interval | None) -> str:
    return iv.text() if iv is not None else "no interval yet (too few launches)"
