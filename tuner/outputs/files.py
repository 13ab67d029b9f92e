"""Outputs stage, files: the one atomic writer. Everything the tool writes for a person or a
program (result.json, policy.json, reports, CSV) is written beside its final name and renamed,
so a reader, or a killed process, never sees half a file.

A `tuner bench` run's figures carry `vllm bench serve`'s names and units (max_concurrency,
num_prompts, spec_decode_draft_tokens, acceptance rate in percent, p99_tpot_ms ...), and its
summary.json is what `vllm bench sweep` keeps per combination (a list of flat run dicts), so
`vllm bench sweep plot OUT_DIR --var-x max_concurrency --var-y output_throughput` reads it.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from tuner.records.configs import EngineSpec
from tuner.records.results import BenchHeader, BenchResult


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write beside the final name, then rename; the temporary file never stays behind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # gone after a rename; after a failure, not left behind
    return path


def write_json(path: Path, payload: object) -> Path:
    """Indented JSON, atomically; values JSON does not know are written as text."""
    return write_atomic(path, json.dumps(payload, indent=2, default=str))


def write_bench_result(out_dir: Path, result: BenchResult, *, header: BenchHeader
                       ) -> dict[str, Path]:
    """result.json (`header`, then the config, the engine and one dict per level, vLLM's keys)
    and summary.json (one flat record per level, as `vllm bench sweep` stores the runs of one
    combination, with the header's engine and metadata). Returns {"result_json": path,
    "summary_json": path}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**header.model_dump(mode="json"), **json.loads(result.model_dump_json(by_alias=True))}
    runs = vllm_runs(result, engine=header.engine_spec, metadata=header.metadata)
    return {"result_json": write_json(out_dir / "result.json", doc),
            "summary_json": write_json(out_dir / "summary.json", runs)}


def vllm_runs(result: BenchResult, *, engine: EngineSpec,
              metadata: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Each level as the flat dict `vllm bench serve --save-result` writes (vLLM's keys and
    units; no per-request lists), plus the run's identity as `vllm bench sweep` adds its
    parameters: the label, the method and the speculative config (as JSON text, so sweep can
    group runs by it), and the user's --metadata at the top level as vLLM puts it."""
    spec = result.config.speculative_config or {}
    model = engine.model_name or engine.model
    ident = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai",
             "label": result.label(), "model_id": model,
             "tokenizer_id": engine.tokenizer or model, "request_rate": "inf",
             "burstiness": 1.0, "method": result.config.method,
             "speculative_config": result.config.spec_json() if spec else None,
             "num_speculative_tokens": spec.get("num_speculative_tokens"),
             "engine_start_s": result.engine.start_s if result.engine.launched else None,
             "vllm_version": result.engine.vllm_version}
    # One measured run per level: sweep's run_number counts repeats of one combination.
    return [{**ident, **(metadata or {}), **lv.vllm_record(), "run_number": 0}
            for lv in result.levels]
