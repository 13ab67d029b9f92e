"""The embedded default's made drafter, built for real into a fresh cache (SPEC_TUNER_CACHE):
the target's own weights less the skipped layers, the target's tokenizer, a label that says
it is made and not trained, built once. The target's conversion is reused
from this machine's cache where it is there (it runs otherwise: under a minute more).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tuner.measure import model


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    converted = model.cache_dir() / "models" / f"{model.EMBEDDED_NAME}-bf16"
    root = tmp_path / "cache"
    (root / "models").mkdir(parents=True)
    if (converted / "config.json").exists():
        os.symlink(converted, root / "models" / converted.name)
    monkeypatch.setenv("SPEC_TUNER_CACHE", str(root))
    return root


def test_the_made_drafter_is_built_once_as_its_recipe_says(cache: Path):
    import torch
    from safetensors.torch import load_file

    folder = model.embedded_draft_dir()
    assert folder.parent == cache / "models" and folder.name.endswith(model.draft_tag())
    config = json.loads((folder / "config.json").read_text())
    kept = [i for i in range(30) if i not in model.DRAFT_SKIPPED]
    assert len(kept) < 30 and model.draft_layers() == kept
    assert config["num_hidden_layers"] == len(kept) and config["vocab_size"] == 49152
    assert config["tie_word_embeddings"] is True
    recipe = json.loads((folder / "made_drafter.json").read_text())
    assert recipe["trained"] is False and recipe["kept_layers"] == kept
    assert "not a trained one" in (folder / "README.md").read_text()
    target_dir = model.embedded_model_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (target_dir / name).read_bytes()

    ours, theirs = load_file(folder / "model.safetensors"), \
        load_file(target_dir / "model.safetensors")
    # Layer n of the drafter is layer kept[n] of the target, unchanged; nothing else is there.
    assert {k for k in ours if ".layers." not in k} == {k for k in theirs if ".layers." not in k}
    assert len({k.split(".")[2] for k in ours if ".layers." in k}) == len(kept)
    for n, i in enumerate(kept):
        for part in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            assert torch.equal(ours[f"model.layers.{n}.{part}"], theirs[f"model.layers.{i}.{part}"])

    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert model.embedded_draft_dir() == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert not [p for p in (cache / "models").iterdir() if ".tmp" in p.name]
