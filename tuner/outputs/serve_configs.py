"""Outputs stage, the serve config files: each level's serve flags as a `vllm serve --config`
YAML file (vllm_config_c<level>.yaml, its concurrency and headline in a comment), written
beside the report and listed in recommendation.json.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.outputs import files
from tuner.outputs.console import HEADLINES

if TYPE_CHECKING:
    from tuner.records.recommendations import Recommendation


def serve_config_name(concurrency: int) -> str:
    return f"vllm_config_c{concurrency}.yaml"


def write_serve_configs(recs: Sequence[Recommendation], out_dir: Path, *,
                        env: Mapping[str, str]) -> dict[int, Path]:
    """Each level's serve flags as a `vllm serve --config` YAML file ({level: path}); a level
    with nothing to serve writes none, and a file left by an earlier report is removed, so
    the folder never offers a config the data no longer supports."""
    import yaml

    written = {}
    for rec in recs:
        path = Path(out_dir) / serve_config_name(rec.concurrency)
        if rec.serve_config is None:
            path.unlink(missing_ok=True)
            continue
        lines = [f"# Concurrency {rec.concurrency}: {HEADLINES[rec.status]}"
                 + (f" {rec.label}" if rec.status == "recommend" else "") + ".",
                 f"# Serve with: vllm serve --config {path.name}"]
        if rec.serve_note:
            lines.append(f"# Note: {rec.serve_note}.")
        if env:
            lines.append("# Measured with the environment: "
                         + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
        text = "\n".join(lines) + "\n" + yaml.safe_dump(rec.serve_config, sort_keys=False)
        written[rec.concurrency] = files.write_atomic(path, text)
    return written
