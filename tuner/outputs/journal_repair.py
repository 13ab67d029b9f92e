"""Outputs, `tuner repair` in words: what was moved out of a study's journal, what was kept,
and what loads now (tuner.records.outcomes JournalRepair)."""

from __future__ import annotations

from tuner.records.outcomes import JournalRepair

SHOWN_LINES = 20  # bad lines listed one by one; the rest counted (all are in the quarantine)


def repair_text(r: JournalRepair) -> str:
    """The lines `tuner repair` prints."""
    if not r.lines:
        return f"{r.journal}: all {r.kept} records are valid; nothing to repair."
    salvaged = sum(1 for n in r.lines if n.salvaged)
    lines = [f"Repaired {r.journal}: moved {len(r.lines)} bad line(s) to {r.quarantine} beside "
             f"it and kept {r.kept} records"
             + (f" ({salvaged} recovered from torn lines)" if salvaged else "") + "."]
    lines += [f"  line {n.line}: " + ("torn start moved, the record after it kept"
                                      if n.salvaged else n.why) for n in r.lines[:SHOWN_LINES]]
    if len(r.lines) > SHOWN_LINES:
        lines.append(f"  ... and {len(r.lines) - SHOWN_LINES} more (all in {r.quarantine})")
    loaded = ", ".join(f"study '{name}' with {n} trials" for name, n in r.studies)
    lines.append(f"The journal loads: {loaded or 'no study in it yet'}.")
    return "\n".join(lines)
