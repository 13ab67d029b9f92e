"""Input checks, files: the output folder is writable, a dataset is a regular file of a size
the driver can hold, an acceptance profile holds per-position rates. One message before
anything runs, not a traceback after a trial."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from tuner.checks.bounds import show
from tuner.errors import ConfigError

DATASET_MAX_BYTES = 1 << 30  # the full ShareGPT JSON (~650 MB) must fit
DATASET_MAX_LINE_BYTES = 16 << 20


def output_dir(path: Path, *, flag: str = "--output-dir", keep: bool = True) -> Path:
    """Create the output folder and write a probe file in it, so a file in the way, a read-only
    or full disk is one message before anything runs, not a traceback after a trial.

    `keep=False`: remove again the folders this check created, so a command can check its
    output folder with the rest of its input and create it only once all of it passed."""
    shown = show(str(path), 200, quote=True)
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{flag} {shown}: is a file, not a folder. Pass a folder path (it is "
                          f"created), or move the file away.") from None
    except OSError as e:
        raise ConfigError(f"{flag} {shown}: cannot create the folder ({_why(e)}). Pass a "
                          f"folder you can write, e.g. {flag} outputs/run1.") from None
    probe = path / f".tuner-write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        fix = ("free space on that disk or pass a folder on another disk"
               if e.errno in (errno.ENOSPC, errno.EDQUOT) else "pass a folder you can write")
        raise ConfigError(f"{flag} {shown}: cannot write in it ({_why(e)}); {fix}, e.g. "
                          f"{flag} /tmp/tuner-run.") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass  # never written, or the disk refuses even that: the message above says why
        if not keep:
            for folder in missing:  # deepest first, and only the ones made here
                try:
                    folder.rmdir()
                except OSError:
                    break  # something else wrote there meanwhile: leave it
    return path


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def dataset_path(text: str) -> str:
    """An argparse `type=` for `--dataset-path`: a readable dataset file (dataset_file)."""
    dataset_file(Path(text))
    return text


def dataset_file(path: Path) -> int:
    """A dataset path that is a regular file within DATASET_MAX_BYTES; returns its size.
    A directory, device or fifo (`/dev/zero` reads forever) is refused by name."""
    shown = show(str(path), 200, quote=True)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"Dataset file {shown} does not exist. Check --dataset-path.") from None
    except OSError as e:
        raise ConfigError(f"Dataset file {shown}: cannot be read ({_why(e)}). Check "
                          f"--dataset-path.") from None
    return dataset_stat(path, st)


def dataset_stat(path: Path, st: os.stat_result) -> int:
    """dataset_file's checks on a stat already taken (an open file's fstat, say)."""
    shown = show(str(path), 200, quote=True)
    if not stat.S_ISREG(st.st_mode):
        what = ("a directory" if stat.S_ISDIR(st.st_mode) else "a device" if
                stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a pipe"
                if stat.S_ISFIFO(st.st_mode) else "not a regular file")
        raise ConfigError(f"--dataset-path {shown}: is {what}, not a dataset file. Pass a "
                          f".jsonl, .json or .parquet file (.jsonl.xz and .json.xz also work).")
    dataset_size(path, st.st_size)
    return st.st_size


def dataset_size(path: Path, size: int) -> None:
    """Refuse a dataset of more than DATASET_MAX_BYTES (its size, or the bytes read so far)."""
    if size > DATASET_MAX_BYTES:
        raise ConfigError(f"--dataset-path {show(str(path), 200, quote=True)}: "
                          f"{size / 2**30:.2f} GiB, above the {DATASET_MAX_BYTES >> 30} GiB "
                          f"limit (it is read into the driver's memory; the full ShareGPT file "
                          f"is 0.65 GiB). Pass a sample of it.")


def acceptance_profile(path: str) -> list[float]:
    """Per-position acceptance rates from a `tuner bench` result.json (its first level that
    has them), or a JSON list of rates."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--acceptance-profile '{path}': cannot read JSON ({e}). Pass the "
                          f"result.json of a `tuner bench` run with a real model.") from None
    if isinstance(data, list):
        rates = data
    else:
        rates = next((lv.get("spec_decode_per_position_acceptance_rates") for lv in
                      data.get("levels", []) if lv.get("spec_decode_per_position_acceptance_rates")),
                     None)
    if not rates or not all(isinstance(r, (int, float)) and 0 <= r <= 1 for r in rates):
        raise ConfigError(f"--acceptance-profile '{path}': no per-position acceptance rates in "
                          f"[0, 1] found. Use the result.json of `tuner bench` with a "
                          f"speculative config on a real model, or a JSON list like [0.7, 0.5].")
    return [float(r) for r in rates]
