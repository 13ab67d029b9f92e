"""What the host does while a measurement of benchmarks/noise_sources.py runs: its probes.

Monitor, a thread started around each measurement, samples /proc every second: the load
average and every other process's CPU (suspect h); this process's descendants, told apart as
engine (vLLM's processes, or what tuner's watchdog started), client (the load generator's
client processes) or own; and each engine process's CPU, the CPUs it ran on, its migrations
and context switches. Where nvidia-smi runs, GpuProbe (a thread of its own) reads the GPU's
clocks, power, temperature and utilisation, and gpu_placement reads once where the GPU sits
(its NUMA node and local CPUs, from sysfs). CpuMark takes this process's CPU (suspect g).
Every summary is a plain dict, written into the measurement's JSON as it is. The parsers of
/proc and nvidia-smi text are pure functions.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any


# --- (g) this process's CPU, its client processes' included ----------------------------------
def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class CpuMark:
    """This process's clock and CPU (its own, and its waited-for children's: the load
    generator's client processes) at one moment."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.self_s = _cpu_s(resource.RUSAGE_SELF)
        self.children_s = _cpu_s(resource.RUSAGE_CHILDREN)

    def until_now(self) -> dict[str, float]:
        now = CpuMark()
        return {"window_s": now.t - self.t, "self_cpu_s": now.self_s - self.self_s,
                "children_cpu_s": now.children_s - self.children_s}


# --- (h) every process's CPU, from /proc -----------------------------------------------------
def parse_stat(text: str) -> tuple[str, int, int]:
    """(command name, parent pid, user + system clock ticks) of one /proc/PID/stat line; the
    name may hold spaces and parentheses, so the fields are read after its last ')'."""
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return name, int(fields[1]), int(fields[11]) + int(fields[12])


def descendants(table: dict[int, tuple[str, int, int]], root: int) -> set[int]:
    """`root` and every process whose chain of parents reaches it."""
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _proc_table() -> dict[int, tuple[str, int, int]]:
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = parse_stat(Path(entry.path, "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    return out


# --- the engine's processes: which they are, their CPU, placement and switches ---------------
ENGINE_TITLES = ("VLLM",)  # vLLM's process titles: VLLM::EngineCore, VLLM::Worker, ...
CLIENT_TITLES = ("tuner-loadgen",)
WATCHDOG = "measure/watchdog.py"  # what tuner's engine watchdog runs: its child is the engine


def stat_processor(text: str) -> int:
    """The CPU a process's main thread last ran on: field 39 of its /proc/PID/stat line."""
    return int(text[text.rindex(")") + 2:].split()[36])


def parse_status(text: str) -> dict[str, Any]:
    """Of /proc/PID/status: the CPUs it may run on, its threads, and its main thread's
    voluntary and involuntary (preempted) context switches."""
    got = {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}
    return {"allowed": got["Cpus_allowed_list"], "threads": int(got["Threads"]),
            "voluntary": int(got["voluntary_ctxt_switches"]),
            "involuntary": int(got["nonvoluntary_ctxt_switches"])}


def parse_schedstat(text: str) -> tuple[int, int]:
    """/proc/PID/schedstat: the main thread's ns on a CPU and ns waiting in a run queue."""
    run_ns, wait_ns, _ = text.split()
    return int(run_ns), int(wait_ns)


def parse_migrations(text: str) -> int | None:
    """se.nr_migrations of /proc/PID/sched: every move of the main thread between CPUs, not
    only those a sample sees; None where the kernel shows no such line."""
    for line in text.splitlines():
        if line.startswith("se.nr_migrations"):
            return int(line.partition(":")[2])
    return None


def parse_cpu_list(text: str) -> set[int]:
    """A CPU list as sysfs and /proc write it ('0-3,8,10-11') as a set of CPU numbers."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part.strip():
            lo, _, hi = part.strip().partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out



def process_label(name: str, cmdline: str) -> str:
    """A short name for a process: vLLM's title in full (the kernel's name keeps 15
    characters), the module a `python -m` runs, else the kernel's name. Never the command
    line itself: it holds the engine's API key."""
    args = cmdline.split()
    if args and name.startswith(ENGINE_TITLES) and args[0].startswith(name):
        return args[0]
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1].rsplit(".", 1)[-1]
    for job in ("resource_tracker", "spawn_main"):
        if job in cmdline:
            return job
    return name


def _role_of(name: str, cmdline: str, parent_cmdline: str) -> str:
    if WATCHDOG in parent_cmdline:
        return "engine"  # whatever command the engine runs (--vllm-cmd)
    if name.startswith(CLIENT_TITLES) or "multiprocessing" in cmdline:
        return "client"  # the load generator's spawned client processes, its resource tracker
    args = cmdline.split()
    if name.startswith(ENGINE_TITLES) or "vllm.entrypoints" in cmdline or any(
            Path(a).name == "vllm" for a in args[:2]):
        return "engine"
    return "own"


def classify(table: dict[int, tuple[str, int, int]], cmdlines: dict[int, str], root: int
             ) -> dict[int, str]:
    """Each process below `root` (not root itself): "engine" (vLLM's, by title or command
    line, or what tuner's watchdog started, and everything below it), "client" (the load
    generator's client processes and what they start) or "own" (the rest: the watchdog,
    nvidia-smi). A process is what its nearest engine or client ancestor is."""
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    roles: dict[int, str] = {}
    todo = [(root, "own")]
    while todo:
        parent, role = todo.pop()
        for child in children.get(parent, []):
            if child == root or child in roles:
                continue
            roles[child] = role if role != "own" else _role_of(
                table[child][0], cmdlines.get(child, ""), cmdlines.get(parent, ""))
            todo.append((child, roles[child]))
    return roles


def _read(pid: int, name: str) -> str:
    return Path("/proc", str(pid), name).read_text()


@dataclass(frozen=True)
class ProcSample:
    """One engine process at one moment (None: the kernel does not show it)."""

    t_s: float
    ticks: int  # user + system, every thread
    cpu: int
    run_ns: int | None  # main thread, on a CPU
    wait_ns: int | None  # main thread, runnable but waiting for a CPU
    migrations: int | None
    allowed: str
    threads: int
    voluntary: int
    involuntary: int


def sample_process(pid: int, t_s: float) -> ProcSample | None:
    """`pid` read from /proc now; None if it is gone."""
    try:
        stat = _read(pid, "stat")
        status = parse_status(_read(pid, "status"))
        ticks, cpu = parse_stat(stat)[2], stat_processor(stat)
    except (OSError, ValueError, KeyError, IndexError):
        return None
    run_ns = wait_ns = migrations = None
    try:
        run_ns, wait_ns = parse_schedstat(_read(pid, "schedstat"))
    except (OSError, ValueError):
        pass
    try:
        migrations = parse_migrations(_read(pid, "sched"))
    except (OSError, ValueError):
        pass
    return ProcSample(t_s=t_s, ticks=ticks, cpu=cpu, run_ns=run_ns, wait_ns=wait_ns,
                      migrations=migrations, **status)


def process_summary(samples: Sequence[ProcSample], clk_tck: float) -> dict[str, Any] | None:
    """An engine process over a measurement: cores in use (all threads; the main thread),
    the main thread's share of time waiting for a CPU, the CPUs it was seen on, how often
    that changed between samples and (kernel's count) in all, and switches per second."""
    if len(samples) < 2 or not samples[-1].t_s > samples[0].t_s:
        return None
    a, b = samples[0], samples[-1]
    span = b.t_s - a.t_s

    def rate(x: int | None, y: int | None, unit: float = 1.0) -> float | None:
        return None if x is None or y is None else (y - x) / unit / span

    changes = sum(x.cpu != y.cpu for x, y in pairwise(samples))
    seen: dict[str, int] = {}
    for s in samples:
        seen[str(s.cpu)] = seen.get(str(s.cpu), 0) + 1
    return {"samples": len(samples), "span_s": round(span, 3),
            "cores": (b.ticks - a.ticks) / clk_tck / span,
            "main_cores": rate(a.run_ns, b.run_ns, 1e9),
            "main_wait_share": rate(a.wait_ns, b.wait_ns, 1e9),
            "cpus": seen, "cpu_series": [s.cpu for s in samples],
            "main_cores_series": [None if x.run_ns is None or y.run_ns is None else
                                  round((y.run_ns - x.run_ns) / 1e9 / (y.t_s - x.t_s), 3)
                                  for x, y in pairwise(samples) if y.t_s > x.t_s],
            "cpu_changes": changes, "cpu_changes_per_s": changes / span,
            "migrations_per_s": rate(a.migrations, b.migrations),
            "voluntary_per_s": rate(a.voluntary, b.voluntary),
            "involuntary_per_s": rate(a.involuntary, b.involuntary),
            "allowed": b.allowed, "threads": b.threads}


# --- the GPU: where it sits (sysfs) and its clocks and power (nvidia-smi) --------------------
SMI_FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu"
SMI_KEYS = ("sm_mhz", "mem_mhz", "power_w", "temp_c", "util_pct")


def parse_smi_line(line: str) -> dict[str, float | None]:
    """One line of `nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits`; a value
    it cannot give ('[N/A]', '[Not Supported]') as None."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(SMI_KEYS):
        raise ValueError(f"nvidia-smi line {line!r}: {len(values)} fields, {len(SMI_KEYS)} asked")

    def number(v: str) -> float | None:
        try:
            return float(v)
        except ValueError:
            return None

    return {k: number(v) for k, v in zip(SMI_KEYS, values, strict=True)}


def sysfs_bus_id(text: str) -> str:
    """nvidia-smi's pci.bus_id (00000000:19:00.0) as sysfs names the device (0000:19:00.0)."""
    domain, _, rest = text.strip().lower().partition(":")
    return f"{domain[-4:]}:{rest}"



def gpu_placement() -> dict[str, Any]:
    """Where the engine's GPU sits, read once a run: its bus id, NUMA node and the CPUs local
    to it (sysfs); {"probe": "missing"} where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return {"probe": "missing"}
    index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    out: dict[str, Any] = {"probe": "nvidia-smi", "index": index, "bus_id": None,
                           "numa_node": None, "local_cpus": None}
    try:
        got = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader",
                              "-i", index], capture_output=True, text=True, timeout=30,
                             check=True).stdout
        out["bus_id"] = sysfs_bus_id(got.splitlines()[0])
    except (OSError, subprocess.SubprocessError, IndexError):
        return out
    device = Path("/sys/bus/pci/devices", out["bus_id"])
    try:
        out["local_cpus"] = (device / "local_cpulist").read_text().strip()
        out["numa_node"] = int((device / "numa_node").read_text())
    except (OSError, ValueError):
        pass
    return out


class GpuProbe(threading.Thread):
    """nvidia-smi's clocks, power, temperature and utilisation every `interval_s`, one call
    at a time in this thread, so that a slow call delays no /proc sample. Its CPU (this
    thread's and its calls') is kept, for (g) to leave out."""

    def __init__(self, index: str, t0: float, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.index, self.t0, self.interval_s = index, t0, interval_s
        self.halt = threading.Event()
        self.samples: list[dict[str, float | None]] = []
        self.errors = 0
        self.cpu_s = 0.0
        self.child: subprocess.Popen[str] | None = None

    def run(self) -> None:
        cpu0 = time.thread_time()
        while not self.halt.is_set():
            t = time.monotonic()
            line = self._call()
            try:
                if line is not None:
                    self.samples.append({"t_s": round(t - self.t0, 2), **parse_smi_line(line)})
            except ValueError:
                self.errors += 1
            self.halt.wait(max(0.0, self.interval_s - (time.monotonic() - t)))
        self.cpu_s += time.thread_time() - cpu0

    def _call(self) -> str | None:
        try:
            child = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}",
                                      "--format=csv,noheader,nounits", "-i", self.index],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        except OSError:
            self.errors += 1
            return None
        self.child = child
        out = child.stdout.read() if child.stdout else ""
        # Reaped here with its own usage, which the caller's children's CPU (g) then holds.
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s += usage.ru_utime + usage.ru_stime
        lines = out.strip().splitlines()
        if child.returncode != 0 or not lines:
            self.errors += 1
            return None
        return lines[0]

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10.0)
        if self.is_alive() and self.child is not None:
            self.child.kill()  # a hung nvidia-smi
            self.join(timeout=5.0)

    def summary(self, placement: dict[str, Any]) -> dict[str, Any]:
        means = {f"{k}_mean": statistics.fmean(v) if (v := [s[k] for s in self.samples
                                                               if s[k] is not None]) else None
                 for k in SMI_KEYS}
        return {**placement, **means, "samples": self.samples, "errors": self.errors,
                "probe_cpu_s": round(self.cpu_s, 3)}


# --- all of it over one measurement ----------------------------------------------------------
class Monitor(threading.Thread):
    """(h) /proc/loadavg and every other process's CPU, sampled each `interval_s` over one
    measurement. This process and its descendants (the engine under its watchdog, the client
    processes) are not "other"; the monitor's own CPU is kept, so (g) can leave it out. Of
    the descendants, each engine process's CPU and placement too (process_summary), and with
    `gpu` (gpu_placement) the GPU's clocks (GpuProbe) where nvidia-smi runs."""

    def __init__(self, interval_s: float = 1.0, gpu: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.interval_s, self.halt = interval_s, threading.Event()
        self.loads: list[float] = []
        self.others: dict[str, int] = {}
        self.own_ticks = 0
        self.role_ticks = {"engine": 0, "client": 0, "own": 0}
        self.cpu_s = self.elapsed_s = 0.0
        self.gpu = gpu
        self.cmdlines: dict[int, str] = {}
        self.labels: dict[int, str] = {}
        self.engine: dict[int, list[ProcSample]] = {}
        self.probe: GpuProbe | None = None

    def run(self) -> None:
        cpu0, t0 = time.thread_time(), time.monotonic()
        if self.gpu is not None and self.gpu.get("probe") == "nvidia-smi":
            self.probe = GpuProbe(self.gpu["index"], t0, self.interval_s)
            self.probe.start()
        prev = _proc_table()
        self._add_engine(prev, prev, 0.0)
        while True:
            stopping = self.halt.wait(self.interval_s)
            now = _proc_table()
            self._add(prev, now)
            self._add_engine(prev, now, time.monotonic() - t0)
            prev = now
            try:
                self.loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
            except (OSError, ValueError):
                pass
            if stopping:
                break
        if self.probe is not None:
            self.probe.stop()
        self.cpu_s, self.elapsed_s = time.thread_time() - cpu0, time.monotonic() - t0

    def _add(self, prev: dict, now: dict) -> None:
        own = descendants(now, os.getpid())
        for pid, (name, _, ticks) in now.items():
            if pid not in prev or prev[pid][0] != name:
                continue
            delta = max(0, ticks - prev[pid][2])
            if pid in own:
                self.own_ticks += delta
            else:
                self.others[name] = self.others.get(name, 0) + delta

    def _add_engine(self, prev: dict, now: dict, t_s: float) -> None:
        """Each descendant's role (its CPU since the last sample goes to the role's total),
        and a sample of each engine process."""
        me = os.getpid()
        for pid in descendants(now, me) - {me} - self.cmdlines.keys():
            try:
                self.cmdlines[pid] = _read(pid, "cmdline").replace("\0", " ").strip()
            except OSError:
                self.cmdlines[pid] = ""
        for pid, role in classify(now, self.cmdlines, me).items():
            if pid in prev and prev[pid][0] == now[pid][0]:
                self.role_ticks[role] += max(0, now[pid][2] - prev[pid][2])
            if role == "engine" and (s := sample_process(pid, t_s)) is not None:
                self.engine.setdefault(pid, []).append(s)
                self.labels[pid] = process_label(now[pid][0], self.cmdlines[pid])

    def summary(self) -> dict[str, Any]:
        clk_tck = os.sysconf("SC_CLK_TCK")
        per_s = clk_tck * max(self.elapsed_s, 1e-9)
        top = sorted(self.others.items(), key=lambda kv: -kv[1])[:3]
        engine = [{"pid": pid, "label": self.labels[pid], **got} for pid, samples
                  in self.engine.items() if (got := process_summary(samples, clk_tck))]
        engine.sort(key=lambda p: -(p["main_cores"] or p["cores"]))
        gpu = None if self.gpu is None else (
            self.probe.summary(self.gpu) if self.probe is not None else dict(self.gpu))
        return {"loadavg_mean": statistics.fmean(self.loads) if self.loads else None,
                "loadavg_max": max(self.loads) if self.loads else None,
                "others_cores": sum(self.others.values()) / per_s,
                "own_tree_cores": self.own_ticks / per_s,
                "others_top": [[name, round(t / per_s, 3)] for name, t in top if t],
                "monitor_cpu_s": round(self.cpu_s, 3), "elapsed_s": round(self.elapsed_s, 3),
                "role_cores": {k: v / per_s for k, v in self.role_ticks.items()},
                "engine": engine, "gpu": gpu}
