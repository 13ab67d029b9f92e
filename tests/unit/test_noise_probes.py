"""benchmarks/noise_probes.py: its reading of /proc and nvidia-smi text, the engine, client
and own processes told apart, and the Monitor and GPU probe threads on this host."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import load_benchmark

probes = load_benchmark("noise_probes")


def test_cpu_mark_counts_this_process_and_its_waited_for_children():
    mark = probes.CpuMark()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.3: pass"], check=True)
    got = mark.until_now()
    assert got["children_cpu_s"] >= 0.25 and got["window_s"] >= got["children_cpu_s"] - 0.05
    assert 0 <= got["self_cpu_s"] < got["window_s"] + 0.05


# --- /proc ------------------------------------------------------------------------------------
def test_a_stat_line_is_read_after_the_last_parenthesis():
    line = "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 9 0 0 0 250 30 0 0 20 0 1 0 9 0 0"
    assert probes.parse_stat(line) == ("my (odd) name", 17, 280)


def test_descendants_follow_parents_down_and_nothing_else():
    table = {1: ("init", 0, 0), 10: ("me", 1, 0), 11: ("watchdog", 10, 0),
             12: ("engine", 11, 0), 13: ("core", 12, 0), 20: ("other", 1, 0)}
    assert probes.descendants(table, 10) == {10, 11, 12, 13}
    assert probes.descendants(table, 20) == {20}


def test_the_monitor_counts_this_process_tree_apart_from_the_others():
    mon = probes.Monitor()
    me = os.getpid()
    prev = {me: ("python", 1, 100), 5: ("busy", 1, 1000), 6: ("gone", 1, 10)}
    now = {me: ("python", 1, 130), 5: ("busy", 1, 1200), 7: ("new", 1, 50)}
    mon._add(prev, now)
    assert mon.own_ticks == 30 and mon.others == {"busy": 200}


STAT = ("4242 (VLLM::EngineCor) S 17 4242 4242 0 -1 4194560 9 0 0 0 250 30 0 0 20 0 12 0 9 "
        "0 0 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 7 0 0 0 0 0 0 0 0 0 0 0 0 0")
STATUS = """Name:\tVLLM::EngineCor
Threads:\t12
Cpus_allowed:\tff
Cpus_allowed_list:\t0-3,8
voluntary_ctxt_switches:\t1500
nonvoluntary_ctxt_switches:\t42
"""


def test_the_engine_fields_are_read_from_proc_text():
    assert probes.stat_processor(STAT) == 7 and probes.parse_stat(STAT) == ("VLLM::EngineCor", 17, 280)
    assert probes.parse_status(STATUS) == {"allowed": "0-3,8", "threads": 12, "voluntary": 1500,
                                       "involuntary": 42}
    assert probes.parse_schedstat("556173634 78851520 500\n") == (556173634, 78851520)
    sched = "python (4242, #threads: 1)\n---\nse.nr_migrations    :    191\nnr_switches : 3\n"
    assert probes.parse_migrations(sched) == 191 and probes.parse_migrations("nr_switches : 3") is None
    assert probes.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert probes.parse_cpu_list("") == set()


def test_an_nvidia_smi_line_and_its_bus_id():
    assert probes.parse_smi_line("1980, 2619, 70.12, 35, 3\n") == {
        "sm_mhz": 1980.0, "mem_mhz": 2619.0, "power_w": 70.12, "temp_c": 35.0, "util_pct": 3.0}
    assert probes.parse_smi_line("1980, 2619, [N/A], 35, [Not Supported]")["power_w"] is None
    with pytest.raises(ValueError, match="2 fields"):
        probes.parse_smi_line("1980, 2619")
    assert probes.sysfs_bus_id("00000000:19:00.0\n") == "0000:19:00.0"
    assert probes.sysfs_bus_id("0000ABCD:9A:00.0") == "abcd:9a:00.0"


def _tree():
    """This process (10), tuner's watchdog and a CPU vLLM below it, the load generator's
    client processes, nvidia-smi, and a stranger (30)."""
    py = "/opt/vllm-env/bin/python"  # a venv path naming vllm must not make a client an engine
    spawn = f"{py} -c from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=9)"
    rows = {10: ("tuner", 1, f"{py} benchmarks/noise_sources.py run"),
            11: ("python", 10, f"{py} -I -S /w/tuner/measure/watchdog.py --grace-s 3.0"),
            12: ("python", 11, f"{py} -m vllm.entrypoints.openai.api_server --api-key tuner-x"),
            13: ("VLLM::EngineCor", 12, "VLLM::EngineCore"),
            14: ("VLLM::Worker", 13, "VLLM::Worker"),
            15: ("python", 12, f"{py} -B -c from multiprocessing.resource_tracker import main"),
            20: ("python", 10, spawn + " --multiprocessing-fork"),
            21: ("tuner-loadgen-1", 10, "x"),
            22: ("nvidia-smi", 10, "nvidia-smi --query-gpu=clocks.sm"),
            30: ("bash", 1, "bash")}
    return ({pid: (name, ppid, 0) for pid, (name, ppid, _) in rows.items()},
            {pid: cmd for pid, (_, _, cmd) in rows.items()})


def test_descendants_are_told_apart_as_engine_client_and_own():
    table, cmdlines = _tree()
    assert probes.classify(table, cmdlines, 10) == {
        11: "own", 12: "engine", 13: "engine", 14: "engine", 15: "engine", 20: "client",
        21: "client", 22: "own"}
    # Whatever the watchdog starts is the engine (--vllm-cmd), and so is all below it.
    cmdlines[12] = "/usr/local/bin/serve-it.sh"
    cmdlines[13] = "python -c from multiprocessing.spawn import spawn_main"
    assert probes.classify(table, cmdlines, 10)[13] == "engine"


def test_a_process_label_never_holds_its_command_line():
    _, cmdlines = _tree()
    assert probes.process_label("VLLM::EngineCor", cmdlines[13]) == "VLLM::EngineCore"
    assert probes.process_label("python", cmdlines[12]) == "api_server"
    assert probes.process_label("python", cmdlines[15]) == "resource_tracker"
    assert probes.process_label("python", cmdlines[20]) == "spawn_main"
    assert probes.process_label("bash", "bash -c 'x --api-key k'") == "bash"


def _sample(t, ticks, cpu, run_s, wait_s, migrations, involuntary):
    return probes.ProcSample(t_s=t, ticks=ticks, cpu=cpu, run_ns=int(run_s * 1e9),
                         wait_ns=int(wait_s * 1e9), migrations=migrations, allowed="0-3",
                         threads=5, voluntary=100, involuntary=involuntary)


def test_a_process_summary_gives_rates_over_its_samples():
    samples = [_sample(0.0, 0, 2, 0.0, 0.0, 10, 5), _sample(1.0, 95, 2, 0.9, 0.05, 12, 8),
               _sample(2.0, 190, 3, 1.9, 0.1, 20, 11), _sample(4.0, 380, 2, 3.9, 0.2, 30, 17)]
    got = probes.process_summary(samples, clk_tck=100)
    assert got["cores"] == pytest.approx(0.95) and got["main_cores"] == pytest.approx(3.9 / 4)
    assert got["main_wait_share"] == pytest.approx(0.05)
    assert got["cpus"] == {"2": 3, "3": 1} and got["cpu_changes"] == 2
    assert got["cpu_changes_per_s"] == pytest.approx(0.5)
    assert got["migrations_per_s"] == pytest.approx(5.0)
    assert got["involuntary_per_s"] == pytest.approx(3.0) and got["voluntary_per_s"] == 0.0
    assert got["main_cores_series"] == pytest.approx([0.9, 1.0, 1.0])
    assert probes.process_summary(samples[:1], clk_tck=100) is None
    no_sched = [replace(s, run_ns=None, migrations=None) for s in samples]
    got = probes.process_summary(no_sched, clk_tck=100)
    assert got["main_cores"] is None and got["migrations_per_s"] is None


def test_the_monitor_samples_an_engine_process_of_this_tree(tmp_path):
    # A child that calls itself vLLM's API server (its command line) and sleeps.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                              "vllm.entrypoints"])
    try:
        mon = probes.Monitor(interval_s=0.25, gpu={"probe": "missing"})
        mon.start()
        time.sleep(1.2)
        mon.halt.set()
        mon.join()
    finally:
        child.kill()
        child.wait()
    got = mon.summary()
    engine = {p["pid"]: p for p in got["engine"]}
    assert list(engine) == [child.pid]
    proc = engine[child.pid]
    assert proc["samples"] >= 4 and proc["label"] == Path(sys.executable).name[:15]
    assert probes.parse_cpu_list(proc["allowed"]) == os.sched_getaffinity(0)  # inherited
    assert {int(c) for c in proc["cpus"]} <= os.sched_getaffinity(0)
    assert proc["cores"] < 0.2 and proc["threads"] == 1
    assert got["gpu"] == {"probe": "missing"} and set(got["role_cores"]) == {
        "engine", "client", "own"}


def _fake_smi(folder, bus_line="00000000:19:00.0"):
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\ncase \"$1\" in\n  --query-gpu=pci.bus_id) echo "
                      f"{bus_line};;\n  *) echo '1980, 2619, 70.12, 35, [N/A]';;\nesac\n")
    script.chmod(0o755)


def test_the_gpu_probe_calls_nvidia_smi_and_keeps_its_cpu(tmp_path, monkeypatch):
    _fake_smi(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    place = probes.gpu_placement()
    assert place["probe"] == "nvidia-smi" and place["bus_id"] == "0000:19:00.0"
    assert place["index"] == "0"
    probe = probes.GpuProbe(place["index"], time.monotonic(), interval_s=0.2)
    probe.start()
    time.sleep(0.7)
    probe.stop()
    got = probe.summary(place)
    assert len(got["samples"]) >= 2 and got["errors"] == 0 and got["probe_cpu_s"] > 0
    assert got["sm_mhz_mean"] == 1980.0 and got["util_pct_mean"] is None
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert probes.gpu_placement() == {"probe": "missing"}
