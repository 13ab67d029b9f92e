"""The package's data is stored xz-compressed and reads exactly as the plain files did.

The expected ids and records below were taken from the plain files before they were compressed
(tokenizer.json sha256 75b3182b..., the datasets' sha256 as their SOURCE.md gives them).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
from pathlib import Path

import pytest

from tuner import checks
from tuner.errors import ConfigError
from tuner.measure import model, workloads

TEXT = "def add(a, b):\n    return a + b  # héllo 123"
IDS = [1604, 803, 24, 81, 28, 278, 727, 472, 1003, 253, 1232, 278, 216, 907, 294, 2756, 31394,
       216, 33, 34, 35]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPEC_TUNER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizers"


def test_the_embedded_tokenizer_unpacks_once_and_encodes_as_before(cache: Path):
    from tokenizers import Tokenizer

    folder = model.embedded_tokenizer_dir()
    assert folder.parent == cache and folder.name.startswith("smollm2-135m-instruct-")
    plain = (folder / "tokenizer.json").read_bytes()
    assert hashlib.sha256(plain).hexdigest() == (
        "75b3182b3a5a2af0f60d57fa1002a42242c0abc4d1954d1bdda925dbb5c7601e")
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).encode(TEXT).ids == IDS
    # Tests, scripts and old studies name the in-package folder: it is read from the cache.
    for name in (workloads.EMBEDDED_TOKENIZER, f"{workloads.EMBEDDED_TOKENIZER}/"):
        tok = workloads.load_tokenizer(name)
        assert tok(TEXT)["input_ids"] == IDS
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False
                                       ).startswith("<|im_start|>system\n")
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    assert model.embedded_tokenizer_dir() == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp  # reused, not rewritten
    assert [p.name for p in cache.iterdir()] == [folder.name]  # no temporary folder left


def test_a_process_that_loses_the_race_uses_the_winners_folder(cache: Path, monkeypatch):
    # Two processes unpack at once: each writes its own temporary folder and renames it; the
    # second rename fails because the first one's folder is there, complete.
    rename = os.rename

    def other_process_first(src: str | Path, dst: str | Path) -> None:
        Path(dst).mkdir()
        (Path(dst) / "tokenizer.json").write_bytes((Path(src) / "tokenizer.json").read_bytes())
        rename(src, dst)  # fails: dst is a folder that is not empty

    monkeypatch.setattr(model.os, "rename", other_process_first)
    folder = model.embedded_tokenizer_dir()
    assert [p.name for p in cache.iterdir()] == [folder.name]
    assert sorted(p.name for p in folder.iterdir()) == ["tokenizer.json"]  # the winner's


def test_an_unwritable_cache_is_a_config_error(tmp_path: Path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SPEC_TUNER_CACHE", str(tmp_path / "file"))
    with pytest.raises(ConfigError, match="Cannot write the embedded tokenizer.*SPEC_TUNER_CACHE"):
        model.embedded_tokenizer_dir()


@pytest.mark.parametrize(("name", "count", "sha256", "first_prompt", "starts"), [
    ("instructcoder", 194, "748403e73bb0a642fb1626f3e03ebcaa2f0058da8b922ceb0f675410c19a68dd",
     lambda r: r["instruction"], "Change the function so that it checks if all numbers"),
    ("sharegpt", 690, "a36f8b3de4efaddef830b97fe17ebbc32ba4a2b39028c0d40b2d127234ec772e",
     lambda r: r["conversations"][0]["value"], "What are the differences between the Dogme"),
    ("spec_bench", 480, "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
     lambda r: r["turns"][0], "Compose an engaging travel blog post about a recent trip"),
])
def test_each_bundled_dataset_reads_the_records_it_had(name, count, sha256, first_prompt, starts):
    path = workloads.BUNDLED[name]
    assert path.name.endswith(".jsonl.xz")
    plain = lzma.decompress(path.read_bytes())
    assert hashlib.sha256(plain).hexdigest() == sha256  # the file SOURCE.md describes
    rows = workloads.read_rows(path)
    assert len(rows) == count
    assert rows[0] == json.loads(plain.split(b"\n", 1)[0])
    assert first_prompt(rows[0]).startswith(starts)


def test_a_users_dataset_reads_the_same_plain_or_xz(tmp_path: Path, monkeypatch):
    rows = [{"prompt": f"question {i} é"} for i in range(5)]
    plain = tmp_path / "d.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    packed = tmp_path / "d.jsonl.xz"
    packed.write_bytes(lzma.compress(plain.read_bytes()))
    array = tmp_path / "d.json.xz"
    array.write_bytes(lzma.compress(json.dumps(rows).encode()))
    assert workloads.read_rows(plain) == workloads.read_rows(packed) == \
        workloads.read_rows(array) == rows
    # The size limit counts what the file decompresses to, not its compressed size.
    monkeypatch.setattr(checks.files, "DATASET_MAX_BYTES", plain.stat().st_size - 1)
    with pytest.raises(ConfigError, match="above the"):
        workloads.read_rows(packed)


def test_a_broken_xz_dataset_is_a_config_error(tmp_path: Path):
    whole = lzma.compress(b'{"prompt": "x"}\n' * 1000)
    for name, data in (("truncated.jsonl.xz", whole[: len(whole) // 2]),
                       ("plain.jsonl.xz", b'{"prompt": "x"}\n')):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ConfigError, match=r"not a readable \.xz file"):
            workloads.read_rows(path)
