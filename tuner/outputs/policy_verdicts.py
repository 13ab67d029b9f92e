"""The load-aware policy in words: the verdict a user reads, the verification's, and the band
table a router can use instead of the schedule, from the figures of the document
(tuner.records.policy.PolicyDocument, which tuner.analysis.policy decides). tuner.api words
the document once (`worded`) before policy.json is written and the terminal prints it, so the
file, the terminal and the report say the same."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.records.policy import Band, PolicyDocument, Verification

SPECULATION_OFF = "Speculation does not pay beyond the noise at any measured level: leave it off."


def worded(doc: PolicyDocument) -> PolicyDocument:
    """The document with its sentences: the verdict, the verification's verdict and, where a
    router must stand in for the schedule (the method takes no changing K, the engine refused
    the schedule or ignored it), the band table."""
    ver = doc.verification
    if ver is not None:
        ver = ver.model_copy(update={"verdict": verification_verdict(ver)})
    return doc.model_copy(update={
        "verification": ver, "verdict": verdict(doc),
        "fallback_bands": tuple(band_table(doc.bands, doc.chosen)) if doc.needs_router
        else None})


def verdict(doc: PolicyDocument) -> str | None:
    """The line a user reads, with whether the engine path or speculation itself decided
    (the document's decomposition); None before the policy is decided (a schedule not yet
    verified)."""
    if doc.schedule_refused is not None:
        text = bands_verdict(doc.chosen, doc.schedule_refused, doc.bands, doc.k_predicted)
    elif doc.verification is not None:
        text = verification_verdict(doc.verification)
    elif doc.speculative_config is None:
        text = SPECULATION_OFF
    else:
        return None
    return text + (f" {doc.decomposition}" if doc.decomposition else "")


def verification_verdict(ver: Verification) -> str:
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


def bands_verdict(label: str, why: str, bands: Sequence[Band], predicted_ks: Sequence[int]
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
