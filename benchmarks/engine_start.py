"""Where an engine's start goes: each launch split into phases, start modes side by side.

Launches the embedded CPU engine (or --model) through tuner.measure.engine.Engine, as a study
does, round after round in alternating order of the modes asked for:

  spawned   every engine a new Python process (today's start, `--no-fast-start`)
  forked    forked from this driver's launcher, which imported torch and vLLM once
  uni       forked, and VLLM_ENABLE_V1_MULTIPROCESSING=0 so that vLLM's CPU platform keeps the
            `uni` executor: the worker runs inside the EngineCore process (an engine-path change,
            measured here, not a default)

and, beside them, one cold `python -c 'import torch, vllm.entrypoints.openai.api_server'` per
round. How each phase is measured: the tool's clock (time.monotonic) at the launch and when
/health answers; the start time of each engine process from /proc (its session, polled every
50 ms, /proc/PID/stat starttime, 10 ms ticks); the arrival time of vLLM's log lines (a thread
tails engine.log every 20 ms; vLLM's logger flushes each line). Phases:

  api_import    launch -> the API server's first log line (its imports; for a forked engine
                the fork, and on a launcher's first launch the launcher's imports too)
  api_config    -> the EngineCore process exists (argument parsing, engine config)
  core_import   -> the EngineCore's first log line (a spawned interpreter's imports)
  worker_start  -> the worker process exists (executor set-up)
  worker_import -> the worker's first log line (its imports; none with `uni`)
  weights       -> "Loading weights took"
  kv_warmup     -> "init engine (profile, create kv cache, warmup model) took"
  ready         -> /health answers 200 (API server set-up)

With `--paired N` it instead measures whether a forked engine serves as a fresh one: N pairs
of identical baseline launches in this one driver, new process and forked alternating (ABBA),
each sent the same request schedule at c=1 and c=4 (16 instructcoder prompts, 64 tokens).

Run: .venv/bin/python benchmarks/engine_start.py [--rounds 3] [--modes spawned,forked]
     [--json OUT.json]; --paired 4 --json OUT.json; --table OUT.json prints a stored run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

PHASES = ("api_import", "api_config", "core_import", "worker_start", "worker_import",
          "weights", "kv_warmup", "ready")
IMPORT_CMD = [sys.executable, "-c", "import torch, vllm.entrypoints.openai.api_server"]
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class Watch:
    """Arrival times of an engine's log lines and start times of its session's processes."""

    def __init__(self, log: Path, t0: float) -> None:
        self.log, self.t0 = log, t0
        self.lines: list[tuple[float, str]] = []
        self.procs: dict[int, float] = {}  # pid -> start, seconds after t0
        self.sid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        pos, partial = 0, b""
        while not self._stop.is_set():
            now = time.monotonic() - self.t0
            try:
                with open(self.log, "rb") as f:
                    f.seek(pos)
                    data = f.read()
                    pos += len(data)
            except OSError:
                data = b""
            partial += data
            *done, partial = partial.split(b"\n")
            self.lines += [(now, ln.decode(errors="replace")) for ln in done]
            if self.sid is not None:
                self._scan()
            time.sleep(0.02)

    def _scan(self) -> None:
        boot_now = time.clock_gettime(time.CLOCK_BOOTTIME)
        mono_now = time.monotonic()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) in self.procs:
                continue
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) != self.sid:
                continue
            started = int(fields[19]) * _TICK_S  # seconds after boot
            self.procs[int(pid)] = mono_now - (boot_now - started) - self.t0

    def first(self, pattern: str, after: float = 0.0) -> float | None:
        rx = re.compile(pattern)
        return next((t for t, ln in self.lines if t >= after and rx.search(ln)), None)

    def pid_tag(self, name: str) -> int | None:
        for _t, ln in self.lines:
            m = re.search(rf"\({name}[^ ]* pid=(\d+)\)", ln)
            if m:
                return int(m.group(1))
        return None


def phases(w: Watch, ready_s: float) -> dict[str, float | None]:
    """The phase boundaries of one launch (seconds after the launch), as differences."""
    api = w.first(r"\(APIServer pid=")
    core_pid, worker_pid = w.pid_tag("EngineCore"), w.pid_tag("(?:VllmWorker|Worker)")
    core_start = w.procs.get(core_pid) if core_pid else None
    core_log = w.first(r"\(EngineCore[^ ]* pid=")
    worker_start = w.procs.get(worker_pid) if worker_pid and worker_pid != core_pid else None
    worker_log = (w.first(r"\((?:VllmWorker|Worker)[^ ]* pid=") if worker_start is not None
                  else None)
    weights = w.first(r"Loading weights took")
    warm = w.first(r"init engine \(profile, create kv cache, warmup model\) took")
    marks = [("api_import", api), ("api_config", core_start), ("core_import", core_log),
             ("worker_start", worker_start), ("worker_import", worker_log),
             ("weights", weights), ("kv_warmup", warm), ("ready", ready_s)]
    out: dict[str, float | None] = {}
    last = 0.0
    for name, t in marks:
        if t is None:
            out[name] = None
            continue
        out[name] = round(t - last, 2)
        last = t
    out["total"] = round(ready_s, 2)
    return out


def launch(spec, mode: str, log: Path) -> dict:
    from tuner.measure.engine import Engine
    from tuner.records.configs import TrialConfig

    config = TrialConfig(engine_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if mode == "uni"
                         else {})
    spec = spec.model_copy(update={"fast_start": mode != "spawned"})
    log.unlink(missing_ok=True)
    t0 = time.monotonic()
    w = Watch(log, t0)
    eng = Engine(spec, config, log_path=log)
    # The session id is the engine's pid, known once it is spawned: watch for it.
    spotter = threading.Thread(target=_spot_session, args=(eng, w), daemon=True)
    spotter.start()
    try:
        eng.start()
        ready_s = time.monotonic() - t0
        time.sleep(0.1)
    finally:
        eng.stop()
        w.stop()
    row = {"mode": mode, **phases(w, ready_s), "start_s": eng.info.start_s if eng.info else None,
           "start": (eng.info.details.get("start") if eng.info else None),
           "refused": (eng.info.details.get("fast_start_refused") if eng.info else None)}
    return row


def _spot_session(eng, w: Watch) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        proc = eng.proc
        if proc is not None and proc.pid:
            w.sid = proc.pid
            return
        time.sleep(0.005)


def cold_import() -> float:
    t0 = time.monotonic()
    subprocess.run(IMPORT_CMD, check=True, capture_output=True)
    return round(time.monotonic() - t0, 2)


def table(rows: list[dict], imports: list[float]) -> str:
    cols = (*PHASES, "total")
    out = [f"cold `import torch, vllm.entrypoints.openai.api_server`: median "
           f"{statistics.median(imports):.1f} s, range {min(imports):.1f}-{max(imports):.1f} s "
           f"(n={len(imports)})", ""]
    head = f"{'mode':<18}" + "".join(f"{c:>17}" for c in cols)
    out += [head, "-" * len(head)]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        name = r["mode"] + (" (1st)" if r.get("first") else "")
        groups.setdefault(name, []).append(r)
    for name, rs in groups.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in rs if r.get(c) is not None]
            if not vals:
                cells.append(f"{'-':>17}")
            elif len(vals) == 1:
                cells.append(f"{vals[0]:>17.1f}")
            else:
                cells.append(f"{statistics.median(vals):.1f} [{min(vals):.1f}-{max(vals):.1f}]"
                             .rjust(17))
        out.append(f"{name + f' n={len(rs)}':<18}" + "".join(cells))
    out += ["", "median [min-max] seconds per phase over the launches of each mode; "
            "(1st): a launcher's first launch, which includes its imports"]
    return "\n".join(out)


def paired(spec, pairs: int, out_dir: Path) -> list[dict]:
    """Identical baseline launches, new process and forked alternating, one request schedule."""
    from tuner.measure import request_schedule, trial, workloads
    from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec

    wl = workloads.load(WorkloadSpec(name="instructcoder", num_prompts=16, output_len=64),
                        tokenizer=spec.tokenizer or spec.model)
    settings = MeasureSettings(concurrencies=(1, 4), num_requests=16)
    schedule, _ = request_schedule.build(wl, settings)
    order = [fast for i in range(pairs) for fast in ((False, True) if i % 2 == 0
                                                      else (True, False))]
    rows = []
    for n, fast in enumerate(order):
        mode = "forked" if fast else "spawned"
        r = trial.measure(spec.model_copy(update={"fast_start": fast}), TrialConfig(), wl,
                          settings, trial_dir=out_dir / f"{n:02d}-{mode}", schedule=schedule)
        row = {"n": n, "mode": mode, "start_s": r.engine.start_s}
        for lv in r.levels:
            c = lv.concurrency
            row |= {f"c{c}_tok_s": round(lv.output_throughput, 2),
                    f"c{c}_tpot_ms": round(lv.mean_tpot_ms, 3),
                    f"c{c}_tokens": lv.total_output_tokens}
        rows.append(row)
        print(row, flush=True)
    return rows


def paired_table(rows: list[dict]) -> str:
    out = []
    for key in ("start_s", "c1_tok_s", "c1_tpot_ms", "c4_tok_s", "c4_tpot_ms"):
        a = [r[key] for r in rows if r["mode"] == "spawned"]
        b = [r[key] for r in rows if r["mode"] == "forked"]
        out.append(f"{key:11} new process {statistics.median(a):8.2f} [{min(a):.2f}-{max(a):.2f}]"
                   f"  forked {statistics.median(b):8.2f} [{min(b):.2f}-{max(b):.2f}]"
                   f"  forked/new process {statistics.median(b) / statistics.median(a):.3f}")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="spawned,forked")
    p.add_argument("--model", help="default: the embedded SmolLM2-135M (CPU engine)")
    p.add_argument("--engine-args", default="", help="extra vLLM flags, one quoted string")
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/engine_start"))
    p.add_argument("--json", type=Path, help="write every launch's row here")
    p.add_argument("--table", type=Path, help="print the table of a --json file; no launch")
    p.add_argument("--paired", type=int, metavar="N",
                   help="N pairs of identical launches measured at c=1 and c=4 instead")
    args = p.parse_args()
    if args.table:
        data = json.loads(args.table.read_text())
        print(paired_table(data["paired"]) if "paired" in data
              else table(data["rows"], data["cold_import_s"]))
        return 0
    import shlex

    from tuner.api import engines
    from tuner.measure import launcher
    from tuner.records.options import EngineOptions

    spec = engines.resolve_engine(EngineOptions(model=args.model, ready_timeout_s=900,
                                                extra_args=tuple(shlex.split(args.engine_args))))
    if args.paired:
        rows = paired(spec, args.paired, args.out_dir)
        launcher.close_all()
        print(paired_table(rows))
        if args.json:
            args.json.write_text(json.dumps({"paired": rows}, indent=1))
        return 0
    modes = args.modes.split(",")
    rows: list[dict] = []
    imports: list[float] = []
    seen: set[str] = set()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for r in range(args.rounds):
        imports.append(cold_import())
        print(f"round {r + 1}: cold import {imports[-1]:.1f} s", flush=True)
        order = modes if r % 2 == 0 else modes[::-1]
        for mode in order:
            row = launch(spec, mode, args.out_dir / f"{mode}-{r}.log")
            # A launcher serves every forked mode with its env: the first launch of each
            # env pays the launcher's imports.
            row["first"] = mode != "spawned" and mode not in seen
            seen.add(mode)
            row["round"] = r
            rows.append(row)
            print(f"  {mode}{' (1st)' if row['first'] else ''}: " + ", ".join(
                f"{k} {row[k]}" for k in (*PHASES, "total")), flush=True)
    launcher.close_all()
    print()
    print(table(rows, imports))
    print(f"\nhost: {os.uname().nodename}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the end; python {sys.version.split()[0]}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "cold_import_s": imports,
                                         "cores": os.cpu_count()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
