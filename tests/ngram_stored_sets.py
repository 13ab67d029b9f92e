"""The stored GPU sets' n-gram launches (vLLM 0.26, H100 and H200), and what the replay makes
of them: read by tests/integration/test_ngram_path_stored_sets.py, and run as a script to write
its fixture with whatever tuner is first on the path:

    git archive d639cb8 tuner | tar -x -C /tmp/pre-v2      # the tuner before V2 was modeled
    PYTHONPATH=/tmp/pre-v2:tests .venv/bin/python tests/ngram_stored_sets.py \\
        > tests/data/ngram_v1_stored_sets.json

For every n-gram launch of benchmarks/data/h100/ngram-study-32p-c1c8, h200/ngram-study-32p,
h200/stepcost-64p and h200/steps-64p: its config replayed over its own tokens and over its
set's baseline tokens, every level, as vLLM's spec-decode counters count (drafts, draft tokens,
accepted tokens, past-end acceptance), and the log lines its engine path comes from. No
benchmark script is imported (tests/benchmarks runs those by their command line).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
SETS = ("h100/ngram-study-32p-c1c8", "h200/ngram-study-32p", "h200/stepcost-64p",
        "h200/steps-64p")


class Launch:
    """One launch of a stored set: its name there, its config (None: no speculation), its
    token capture's path and its engine log's path lines (None: not stored)."""

    def __init__(self, name: str, spec: dict | None, tokens: Path, log: str | None) -> None:
        self.name, self.spec, self.tokens, self.log = name, spec, tokens, log


def launches(name: str) -> Iterator[Launch]:
    data = DATA / name
    if (data / "launches.list").exists():  # `tuner bench` launches, one folder each
        for line in (data / "launches.list").read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            label, spec, _args, _env = line.split("|")
            log = data / label / "engine_path.txt"
            yield Launch(label, None if spec == "none" else json.loads(spec),
                         data / label / "tokens.npz", log.read_text() if log.exists() else None)
    elif (data / "engine_paths.txt").exists():  # a study's trials, their logs' path lines
        import pandas as pd

        raw = pd.read_csv(data / "trials_raw.csv")
        logs: dict[str, list[str]] = {}
        for line in (data / "engine_paths.txt").read_text().splitlines():
            number, _, text = line.partition(": ")
            logs.setdefault(number, []).append(text)
        for number, rows in raw.groupby("trial"):
            spec = rows.iloc[0]["spec_json"]
            yield Launch(f"trial{number}", json.loads(spec) if isinstance(spec, str) else None,
                         data / "tokens" / f"{number}.npz", "\n".join(logs.get(str(number), [])))
    else:  # a study folder: its Optuna journal and trials/N/tokens.npz
        from tuner.search import study as st
        from tuner.search import trials

        study = st.open_existing(data, None, None)
        for m in trials.measured_trials(study, data, captures=False):
            yield Launch(f"trial{m.number}", m.config.speculative_config,
                         data / "trials" / str(m.number) / "tokens.npz", None)


def figures(**replay_kwargs) -> dict[str, dict]:
    """set -> "launch over tokens" -> level -> vLLM's counters as the replay counts them."""
    from tuner.records.configs import TrialConfig
    from tuner.replay import acceptance
    from tuner.tokens import TokenCapture

    out: dict[str, dict] = {}
    for name in SETS:
        found = list(launches(name))
        base = next(x for x in found if x.spec is None and x.tokens.exists())
        captures = {"baseline": TokenCapture.load(base.tokens)}
        per: dict[str, dict] = {}
        for x in found:
            if not (x.spec and x.spec.get("method") == "ngram" and x.tokens.exists()):
                continue
            for over, cap in (("own", TokenCapture.load(x.tokens)),
                              ("baseline", captures["baseline"])):
                replayed = acceptance.replay(cap, TrialConfig(speculative_config=x.spec),
                                             **replay_kwargs)
                per[f"{x.name} over {over} tokens"] = {
                    str(c): {"num_drafts": a.drafts, "num_draft_tokens": a.draft_tokens,
                             "num_accepted_tokens": a.accepted_tokens, "steps": a.steps,
                             "expected_past_end": round(a.expected_past_end, 9)}
                    for c, a in sorted(replayed.items())}
        out[name] = per
    return out


if __name__ == "__main__":
    json.dump(figures(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
