"""Search stage, the host's noise profile: how far identical launches spread on this machine,
kept across studies, so a study starts from what the host has shown rather than from the
two degrees of freedom of its own first repeats.

One JSON file per machine key (device, vLLM version, model and engine flags: what the spread
of a launch depends on besides the load), holding per study and level the pooled sum of
squares of log throughput of every config launched at least twice there (tuner.intervals.Pool)
with its degrees of freedom and when it was written. A study's entry is replaced each time it
writes, so a resumed study never counts twice. Only the newest studies count, up to WINDOW_DF
degrees of freedom per level: a host whose load has changed (another job gone, a new
neighbour) is judged by what it showed lately, not by everything it ever showed. The folder is $SPEC_TUNER_NOISE_DIR, else `noise` in spec-tuner's
cache ($SPEC_TUNER_CACHE, else ~/.cache/spec-tuner); a profile that cannot be read or
written is left alone (the study goes on with what it has).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from tuner import intervals
from tuner.measure import model
from tuner.records.selection import HostNoise
from tuner.records.storage import StudySettings

# Where the host has shown nothing yet: a 2-core host's 16-request levels spread 0.2-5%
# (docs/method.md); 5% on 2 degrees of freedom makes a first study launch repeats.
DEFAULT = HostNoise(sd=0.05, df=2, source="default")
# Below this many degrees of freedom a study repeats its baseline once, so the profile learns
# the host's spread for the studies that follow.
LEARNED_DF = 8
# The degrees of freedom per level the profile pools, newest studies first (three studies that
# each repeat a config four times); older entries are dropped when a study writes.
WINDOW_DF = 24


def folder() -> Path:
    """$SPEC_TUNER_NOISE_DIR, else the folder `noise` of spec-tuner's cache (the embedded
    model's: tuner.measure.model.cache_dir)."""
    own = os.environ.get("SPEC_TUNER_NOISE_DIR")
    return Path(own) if own else model.cache_dir() / "noise"


def machine_key(settings: StudySettings) -> str:
    """What a launch's spread depends on besides its load: device, vLLM, model, engine flags."""
    fp = settings.fingerprint
    parts = [fp.device or "", fp.vllm or "", settings.engine_spec.model,
             " ".join(settings.engine_spec.extra_args)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _path(key: str) -> Path:
    return folder() / f"{key}.json"


def _read(key: str) -> dict:
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _newest(studies: dict, concurrency: str, *, study: str) -> dict[str, dict]:
    """The entries at `concurrency` other than `study`'s, by study, newest first, as far back
    as WINDOW_DF degrees of freedom reach (entries without a time count as oldest)."""
    found = []
    for name, levels in studies.items():
        entry = levels.get(concurrency) if isinstance(levels, dict) else None
        if name == study or not isinstance(entry, dict):
            continue
        try:
            found.append((float(entry.get("at", 0.0)), name,
                          {"ss": float(entry["ss"]), "df": int(entry["df"]),
                           "launches": int(entry.get("launches", 0))}))
        except (KeyError, TypeError, ValueError):
            continue
    kept, df = {}, 0
    for _at, name, entry in sorted(found, key=lambda f: -f[0]):
        if df >= WINDOW_DF:
            break
        kept[name] = entry
        df += entry["df"]
    return kept


def host_noise(key: str, concurrency: int, *, study: str, pool: intervals.Pool) -> HostNoise:
    """The spread at `concurrency`: the profile's newest other studies pooled with this study's
    own repeats (`pool`) and DEFAULT's (as that many pseudo-launches: a host that has shown one
    quiet repeat is not taken to be quiet); DEFAULT where neither has degrees of freedom."""
    squares, df, launches = pool.sd ** 2 * pool.df, pool.df, pool.df + pool.configs
    other = _newest(_read(key).get("studies", {}), str(concurrency), study=study)
    for entry in other.values():
        squares += entry["ss"]
        df += entry["df"]
        launches += entry["launches"]
    if df <= 0:
        return DEFAULT
    squares += DEFAULT.sd ** 2 * DEFAULT.df
    df += DEFAULT.df
    return HostNoise(sd=(squares / df) ** 0.5, df=df, launches=launches,
                     source="profile" if other else "study")


def record(key: str, concurrency: int, *, study: str, pool: intervals.Pool) -> None:
    """Keep this study's repeats at `concurrency` in the profile (its entry replaced, the
    entries past the window at every level dropped)."""
    if pool.df <= 0:
        return
    data = _read(key)
    studies = data.setdefault("studies", {})
    studies.setdefault(study, {})[str(concurrency)] = {
        "ss": pool.sd ** 2 * pool.df, "df": pool.df, "launches": pool.df + pool.configs,
        "at": time.time()}
    levels = {c for entry in studies.values() if isinstance(entry, dict) for c in entry}
    wanted = {study}.union(*(_newest(studies, c, study=study) for c in levels))
    data["studies"] = {name: entry for name, entry in studies.items() if name in wanted}
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        return
