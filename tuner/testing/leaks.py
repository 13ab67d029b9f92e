"""Leak checks: what "nothing left behind" means, for the tests (tests/integration/test_faults.py, the fault table).

Every engine a test or the drill starts carries a marker in its environment (MARK=value). After
a fault, nothing may be left: no live process with that marker (vLLM renames its engine core
`VLLM::EngineCore`, but the environment stays), no live process in the engine's process group,
and nothing listening on the engine's port. Linux only: it reads /proc.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from pathlib import Path


def _stat_fields(pid: str) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...]; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def marked_processes(mark: str, value_prefix: str) -> list[str]:
    """Live (non-zombie) processes whose environment has mark=<value starting with
    value_prefix>, as "pid N: cmdline"; this process itself is never listed."""
    found = []
    needle = f"{mark}={value_prefix}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if not any(item.startswith(needle) for item in env):
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = _stat_fields(pid)
        if fields and fields[0] not in ("Z", "X"):
            found.append(f"pid {pid}: {cmd.strip()[:100]}")
    return found


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat_fields(pid)
        if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(pid))
    return out


def session_members(sid: int) -> list[str]:
    """Live (non-zombie) processes of a session, as "pid N: cmdline". vLLM renames its engine
    core and workers with setproctitle, which overwrites /proc/PID/environ, so the marker is
    not seen there; the engine's session (it starts one) still holds them."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat_fields(pid)
        if not fields or int(fields[3]) != sid or fields[0] in ("Z", "X"):
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found.append(f"pid {pid}: {cmd.strip()[:100]}")
    return found


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on host:port."""
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


def leftovers(mark: str, value_prefix: str, *, pgids: tuple[int, ...] | list[int] = (),
              ports: tuple[int, ...] | list[int] = (), wait_s: float = 10.0) -> list[str]:
    """What survived, polled for up to wait_s: a killed driver's watchdog needs a moment to
    tear the engine tree down. Empty when nothing is left."""
    deadline = time.monotonic() + wait_s
    while True:
        left = marked_processes(mark, value_prefix)
        named = " ".join(left)
        left += [f"pid {p} in engine group {g}" for g in pgids for p in group_members(g)
                 if f"pid {p}:" not in named]
        left += [f"port {p} still accepts connections" for p in ports if listening(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def engine_of(log: Path) -> tuple[int, int] | None:
    """(pid, port) of the last engine that wrote `log`, from uvicorn's and vLLM's own lines."""
    text = log.read_text(errors="replace") if log.exists() else ""
    pids = re.findall(r"Started server process \[(\d+)\]", text)
    ports = re.findall(r"Starting vLLM server on http://[\d.]+:(\d+)", text)
    return (int(pids[-1]), int(ports[-1])) if pids and ports else None


def wait_for(path: Path, text: str, *, timeout_s: float, after: str | None = None,
             stop: threading.Event | None = None) -> bool:
    """Wait until `text` appears in the file (after the marker `after`, when given)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        body = path.read_text(errors="replace") if path.exists() else ""
        if after is not None:
            body = body.split(after, 1)[1] if after in body else ""
        if text in body:
            return True
        time.sleep(0.1)
    return False
