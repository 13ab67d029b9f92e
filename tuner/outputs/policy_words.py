"""The load-aware policy in words: the headline a user reads, the verification's, and the band
table a router can use instead of the schedule, from the figures of the document
(tuner.records.policy.PolicyDocument, which tuner.analysis.policy decides). tuner.api words
the document once (`worded`) before policy.json is written and the terminal prints it, so the
file, the terminal and the report say the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tuner.analysis.decomposition import POLICY_KEYS
from tuner.records.policy import (
    Band,
    LevelSpeedup,
    LevelStat,
    PathChange,
    PolicyDocument,
    ScheduleBasis,
    ScheduleCheck,
    ScheduleVerification,
)
from tuner.records.speedup import Measured, SpeedupSplit, ratio_text

SPECULATION_OFF = "Speculation does not pay beyond the noise at any measured level: leave it off."


def worded(doc: PolicyDocument) -> PolicyDocument:
    """The document with its sentences: the split of the chosen config's speedup, the headline,
    the verification's headline and, where a router must stand in for the schedule (the method
    takes no changing K, the engine refused the schedule or ignored it), the band table."""
    ver = doc.verification
    if ver is not None:
        ver = ver.model_copy(update={"headline": verification_headline(ver)})
    chosen = next((c for c in doc.configs if c.label == doc.chosen), None)
    split = None if chosen is None else split_sentence(doc.chosen, chosen.stats)
    return doc.model_copy(update={
        "decomposition": split, "verification": ver, "headline": _headline(doc, split),
        "fallback_bands": tuple(band_table(doc.bands, doc.chosen)) if doc.needs_router
        else None})


def headline(doc: PolicyDocument) -> str | None:
    """The line a user reads, with whether the engine path or speculation itself decided
    (the document's decomposition); None before the policy is decided (a schedule not yet
    verified)."""
    return _headline(doc, doc.decomposition)


def _headline(doc: PolicyDocument, split: str | None) -> str | None:
    if doc.schedule_refused is not None:
        text = bands_headline(doc.chosen, doc.schedule_refused, doc.bands, doc.k_predicted)
    elif doc.schedule_check is not None:
        text = withheld_headline(doc.chosen, doc.schedule_check, doc.k_stats)
    elif doc.verification is not None:
        text = verification_headline(doc.verification)
    elif doc.speculative_config is None:
        text = SPECULATION_OFF
    else:
        return None
    return text + (f" {split}" if split else "")


def verification_headline(ver: ScheduleVerification) -> str:
    """How the schedule fared on the ladder, or why the engine did not run it."""
    if ver.engine_rejected:
        return (f"The installed vLLM did not run the schedule ({ver.reason}); use the band "
                f"table below in a router instead.")
    low = ver.rows[0]
    text = ("Verified on the ladder: the policy is never below the baseline beyond the noise"
            if not ver.worse_at else
            f"The policy fell below the baseline beyond the noise at concurrency "
            f"{', '.join(map(str, ver.worse_at))}")
    text += (f"; at concurrency {low.concurrency} it keeps {low.policy_speedup:.2f}x against "
             f"the static config's {(low.static_speedup or float('nan')):.2f}x.")
    if not ver.honoured:
        text += (" The engine kept drafting where the table says K=0: it ignored the "
                 "schedule; use the band table in a router.")
    return text


def withheld_headline(label: str, check: ScheduleCheck,
                     k_stats: Mapping[int, Mapping[int, LevelSpeedup]]) -> str:
    """The words of a schedule withheld though the method takes a changing K: why (the rule
    from vLLM's source, or what the verify launch showed) and what holds instead."""
    why = []
    if ScheduleBasis.PATH_PREDICTED in check.basis:
        why.append(f"with a table vLLM builds another engine path than the one the bands were "
                   f"measured on ({_changes(check.changes)}; {check.vllm_source}), a path "
                   f"the ladder never measured")
    if ScheduleBasis.PATH_MEASURED in check.basis:
        why.append(f"its verify launch ran another engine path than the static config "
                   f"({_changes(check.changes)})")
    issue = f" (vLLM issue {check.vllm_issue})" if check.vllm_issue else ""
    for basis, what in ((ScheduleBasis.DRAFTS_WHERE_OFF, "drafted where the table says K=0"),
                        (ScheduleBasis.NO_DRAFTS_WHERE_ON,
                         "drafted almost nothing where the table says K>0")):
        if basis in check.basis:
            why.append(f"it {what}: the engine ignored the table{issue}")
    if ScheduleBasis.SLOWER in check.basis:
        why.append("it measured below its band's static K (the baseline where K=0) beyond the "
                   "noise")
    where = (f" (concurrency {', '.join(map(str, check.levels))})" if check.levels else "")
    text = (f"No per-batch-size schedule for {label}: " + "; ".join(why) + where + ".")
    if check.offered_k:
        paying = [c for c, st in sorted(k_stats.get(check.offered_k, {}).items())
                  if st.speedup > 1.0 + st.noise]
        text += (f" Offered instead: static K={check.offered_k}, the K of the band that pays"
                 + (f" (beyond the noise at concurrency {', '.join(map(str, paying))})"
                    if paying else "")
                 + ", as one engine, or an engine per band of load (the router table below).")
    if check.basis == (ScheduleBasis.PATH_PREDICTED,):
        text += " No launch was spent on the schedule."
    return text


def _changes(changes: Sequence[PathChange]) -> str:
    return ", ".join(f"{c.field} {c.static or '?'} -> {c.schedule or '?'}" for c in changes)


def bands_headline(label: str, why: str, bands: Sequence[Band], predicted_ks: Sequence[int]
                  ) -> str:
    """The words of a policy that offers bands where vLLM takes no schedule."""
    off = next((s for s, _, k in bands if k == 0), None)
    stops = (f" speculation stops paying from concurrency {off};" if off is not None else "")
    guessed = sorted({k for *_, k in bands if k in predicted_ks})
    return (f"No per-batch-size schedule for {label}: {why}. Offered instead: a static K per "
            f"band of concurrency (the router table below: send each band to an engine "
            f"started with that K);{stops} each band's K is the best one measured there"
            + (f" (K {', '.join(map(str, guessed))} predicted by the replay, not measured)"
               if guessed else "")
            + ". No launch was spent on a schedule vLLM would refuse.")


def band_table(bands: Sequence[Band], label: str) -> list[str]:
    """The router fallback: plain-language bands for when the engine ignores the table. The
    last band runs to the engine's batch limit, so it holds for any load above its start."""
    lines = []
    for i, (s, e, k) in enumerate(bands):
        span = f"concurrency {s} and above" if i == len(bands) - 1 else \
            f"concurrency {s}-{e}"
        lines.append(f"{span}: " + (f"speculate with {label}, K={k}" if k else "speculation off"))
    return lines


def split_sentence(label: str, stats: Mapping[int, LevelStat]) -> str | None:
    """One sentence over the ladder: per level, the total speedup as path cost x speculation
    gain, each with its spread in the ratio's units as the recommendation and the report
    write them; None when no level is split."""
    parts = []
    for c, s in sorted(stats.items()):
        if s.path_cost is None:
            continue
        total = Measured(value=s.speedup, relative_spread=s.noise)
        split = SpeedupSplit(total_speedup=total, **{
            name: Measured(value=getattr(s, value_key), relative_spread=getattr(s, noise_key))
            for name, (value_key, noise_key) in POLICY_KEYS.items()})
        parts.append(f"c={c} {ratio_text(total.value, total.spread)} = {split}")
    if not parts:
        return None
    return (f"{label} over the plain baseline, split into the engine path's cost (aligned "
            f"baseline over plain) and speculation's own gain: " + "; ".join(parts) + ".")
