"""Command line: parse options into validated records, call tuner.api, map errors to exit codes.

Exit status: 0 success, 2 a user mistake (ConfigError or a bad flag; one message, no
traceback), 1 an optimize study with nothing to compare (every trial, or the baseline, failed;
one line with the most common reason), 130 interrupted. Anything else is a bug and shows its
traceback.

Habits users bring from `vllm bench serve` and other CLIs: `-V/--version`; `-q`/`-v` before or
after the command (-v: each engine's start command and log path, and how the search decided:
the replay, the step-cost fit, token streams, the grid climb, the ranking's figures);
`--help` shows every default and the valid names; vLLM's flag names where they mean the same
(`--num-warmups`, `--metadata`, `--disable-tqdm`); an option whose value is itself a vLLM
command line (`--engine-args '--enforce-eager'`) takes it in either form, with or without "=".
Every input is checked before anything is printed or created.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Collection, Sequence

from tuner import api
from tuner.cli import (
    bench,
    optimize,
    policy,
    predict,
    recommend,
    repair,
    report,
    verify,
)
from tuner.cli.arguments import HelpFormatter, Version, add_verbosity
from tuner.errors import ConfigError

# Options whose value is a command line of its own. Such a value often starts with "--", which
# argparse takes for one more option ("unrecognized arguments") unless it is attached with "=".
ENGINE_STRING_OPTIONS = ("--engine-args", "--aligned-baseline", "--vllm-cmd")


# The commands, in the order `tuner --help` lists them: each module holds the command's
# arguments beside the options record they fill (`add_arguments`), and its `run`.
_MODULES = {"bench": bench, "optimize": optimize, "report": report, "policy": policy,
            "recommend": recommend, "verify": verify, "predict": predict, "repair": repair}
COMMANDS = {name: module.run for name, module in _MODULES.items()}


def _help_names() -> dict[str, str]:
    """The valid names `--help` lists where the value is checked later (tuner.api.names)."""
    return {kind: ", ".join(found) for kind, found in api.names().items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description="Measure and tune speculative "
                                     "decoding for vLLM.", formatter_class=HelpFormatter)
    parser.add_argument("-V", "--version", action=Version,
                        help="print tuner's and vLLM's versions and exit")
    add_verbosity(parser, sub=False)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    add_verbosity(common, sub=True)
    names = _help_names()
    for name, module in _MODULES.items():
        module.add_arguments(sub.add_parser(name, parents=[common], formatter_class=HelpFormatter,
                                            help=module.HELP), names)
    return parser


_DISK_ERRORS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded",
                errno.EROFS: "Read-only file system", errno.EACCES: "Permission denied"}


def _disk_error_message(e: OSError, args: argparse.Namespace) -> str:
    """A full or unwritable disk is the user's to fix: say which file, and that nothing
    finished is lost (a torn last journal line is quarantined on the next open)."""
    folder = getattr(args, "output_dir", None) or getattr(args, "study_dir", None)
    where = (str(e.filename) if e.filename else
             f"a file under {folder}" if folder else "the study folder")
    where = ("on " if e.errno == errno.EACCES else "writing ") + where  # EACCES: maybe a read
    fix = ("free space or use --output-dir on another disk"
           if e.errno in (errno.ENOSPC, errno.EDQUOT) else
           "fix the permissions or use a writable --output-dir")
    return (f"{_DISK_ERRORS[e.errno]} {where}. {fix[0].upper() + fix[1:]}; finished trials are "
            f"kept, and the same command resumes.")


def _sigterm_as_exit(signum: int, _frame: object) -> None:
    # `timeout`, systemd and schedulers stop us with SIGTERM: unwind like Ctrl-C so every
    # engine context manager reaps its process group and finished trials stay stored.
    raise KeyboardInterrupt(f"signal {signum}")


def attach_engine_strings(argv: Sequence[str], ours: Collection[str]) -> list[str]:
    """`--engine-args '--enforce-eager'` -> `--engine-args=--enforce-eager` for each of
    ENGINE_STRING_OPTIONS, so argparse reads a value that starts with "-" as the value. A value
    that is one of `ours` (tuner's own option strings) is left alone: `--aligned-baseline`
    may stand without a value, and for the others argparse then says the value is missing."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # the rest is positional, as argparse reads it
            return out + list(argv[i:])
        value = argv[i + 1] if i + 1 < len(argv) else None
        if (arg in ENGINE_STRING_OPTIONS and value is not None and value.startswith("-")
                and value.partition("=")[0] not in ours):
            out.append(f"{arg}={value}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its commands."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return found


def _log_to_stderr(verbose: bool) -> None:
    """-v: DEBUG lines of tuner's loggers on stderr (one handler, however often main runs)."""
    log = logging.getLogger("tuner")
    for h in [h for h in log.handlers if getattr(h, "tuner_cli", False)]:
        log.removeHandler(h)
    log.setLevel(logging.DEBUG if verbose else logging.NOTSET)
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.tuner_cli = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("tuner: debug: %(message)s"))
        log.addHandler(handler)


def _optuna_verbosity(*, verbose: bool) -> None:
    """Optuna's INFO lines ("A new study created ...") on stderr: our own lines replace them,
    so they show with -v only. Set once here, for whichever command opens a study."""
    import optuna  # deferred: `--help` and `--version` answer without it

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(attach_engine_strings(argv, option_strings(parser)))
        if args.quiet and args.verbose:
            raise ConfigError("-q and -v together: -q prints results only, -v adds debug "
                              "lines. Pick one.")
    except ConfigError as e:  # a value refused by its bound as argparse converted it
        print(f"tuner: error: {e}", file=sys.stderr)
        return 2
    for dest, line in getattr(args, "deprecated", ()):
        # With --traffic, --concurrency keeps its meaning: the levels the replay runs.
        if not (dest == "levels" and getattr(args, "traffic", None)):
            print(f"tuner: warning: {line}", file=sys.stderr)
    _log_to_stderr(args.verbose)
    _optuna_verbosity(verbose=args.verbose)
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
    try:
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a pipe's buffer is written here, inside the handler below
        return code
    except ConfigError as e:
        print(f"tuner: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `tuner recommend DIR --json | head -1`: the reader left. Stop quietly, as CLI tools
        # killed by SIGPIPE do (128 + 13); stdout goes to /dev/null so that the interpreter's
        # own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        if e.errno not in _DISK_ERRORS:
            raise
        print(f"tuner: error: {_disk_error_message(e, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Exiting anyway: one more Ctrl-C must not turn the message into a traceback.
        held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            # Said only once checked: every engine context manager has reaped its group by now.
            left = api.live_engines()
            if not left:
                print("tuner: interrupted; engines were stopped, finished results are kept.",
                      file=sys.stderr)
            for pid in left:
                print(f"tuner: interrupted; engine pid {pid} is still running: SIGTERM and "
                      f"SIGKILL did not end its process group (its watchdog keeps trying). "
                      f"Finished results are kept. Check it with `ps -g {pid}`; "
                      f"`kill -KILL -- -{pid}` stops it.", file=sys.stderr)
        finally:
            for sig, handler in held.items():
                signal.signal(sig, handler)
        return 130


if __name__ == "__main__":
    sys.exit(main())
