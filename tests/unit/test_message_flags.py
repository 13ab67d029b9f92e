"""Every `--flag` a message of tuner/ names (the text of a ConfigError, a refusal, a warning or a
line said to the user) is a flag of the tuner's own parser (tuner.cli.build_parser), unless its
context makes it another program's: vLLM's flags (the fields of vLLM's EngineArgs and
FrontendArgs, read from their source without importing vLLM) where the message speaks of the
engine or the server, and the flags of a command the message spells out (`pip install ...`,
scripts/*.sh). A message that named `--acceptance-rates` for `--acceptance-profile` sent users
to a flag that does not exist.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from pathlib import Path

import pytest

import tuner
from tuner.cli import build_parser

PACKAGE = Path(tuner.__file__).resolve().parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")
# The calls whose string arguments reach a user: refusals, failures, warnings, progress lines.
MESSAGE_CALLS = {"ConfigError", "unknown_name", "warn", "warning", "warning_once", "error",
                 "info", "say", "detail", "note", "print"}
# The text before a flag that makes it another command's (within the same clause).
EXTERNAL_COMMAND = re.compile(r"(pip install|scripts/[\w.]+\.sh|vllm serve|vllm bench)"
                              r"[^.;()]*$")
# A message that speaks of the engine: its vLLM flags are vLLM's.
ENGINE_CONTEXT = re.compile(r"engine|vLLM|server|--engine-args|--aligned-baseline")


def _parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    out: set[str] = set()
    for action in parser._actions:
        out.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _parser_flags(sub)
    return out


OURS = _parser_flags(build_parser())


# vLLM's argument classes that `vllm serve` builds its flags from (0.32's files; older ones
# named where they were): a flag per field.
VLLM_ARG_CLASSES = (("engine/arg_utils.py", "EngineArgs"),
                    ("entrypoints/launchers/cli_args.py", "BaseFrontendArgs"),
                    ("entrypoints/launchers/cli_args.py", "FrontendArgs"),
                    ("entrypoints/openai/cli_args.py", "FrontendArgs"))


def _vllm_engine_flags() -> set[str]:
    """`vllm serve`'s flags: one per field of vLLM's EngineArgs and FrontendArgs (read from
    their source), `--no-` too for a bool, as vLLM's parser spells them."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return set()
    root = Path(list(spec.submodule_search_locations)[0])
    out = set()
    for rel, name in VLLM_ARG_CLASSES:
        if not (root / rel).is_file():
            continue
        tree = ast.parse((root / rel).read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name):
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    flag = "--" + node.target.id.replace("_", "-")
                    out.add(flag)
                    if "bool" in ast.unparse(node.annotation):
                        out.add("--no-" + flag[2:])
    return out


VLLM = _vllm_engine_flags()


def _text(node: ast.AST) -> str:
    """A string literal, an f-string (its literal parts) or a sum of them, as one text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if not isinstance(v, ast.FormattedValue) else "{}"
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    return ""


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


# Where a message is built before it is raised or said: a variable of one of these names, or
# what a function named why... / ...refusal / ...message returns.
MESSAGE_NAMES = re.compile(r"^_?(why|reason|refused|msg|message|hint|verdict|note)\w*$")
MESSAGE_FUNCS = re.compile(r"^_?(why\w*|\w*refusal|\w*message|\w*verdict)$")


def _joined(node: ast.AST) -> str:
    texts = [_text(n) for n in ast.walk(node) if isinstance(n, (ast.Constant, ast.JoinedStr))]
    return " ".join(t for t in texts if t)


def messages(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every message a module passes on: the string arguments of the
    MESSAGE_CALLS and of any *Error / *Failed, the strings given to message-named variables
    and returned by message-named functions; joined per expression (an f-string over several
    lines is one text)."""
    parts: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name in MESSAGE_CALLS or name.endswith(("Error", "Failed")):
                parts += [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and MESSAGE_NAMES.match(t.id) for t in targets):
                parts.append(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                MESSAGE_FUNCS.match(node.name):
            parts += [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value]
    out = []
    for part in parts:
        text = _joined(part)
        if text:
            out.append((part.lineno, text))
    return out


def unknown_flags(text: str) -> list[str]:
    """The flags of `text` that are neither the tuner's nor, by their context, another
    program's."""
    bad = []
    for m in FLAG.finditer(text):
        flag = m.group()
        if flag in OURS:
            continue
        if EXTERNAL_COMMAND.search(text[:m.start()]):
            continue
        if flag in VLLM and ENGINE_CONTEXT.search(text):
            continue
        bad.append(flag)
    return bad


def _all_messages() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        out += [(str(path.relative_to(PACKAGE.parent)), line, text)
                for line, text in messages(tree)]
    return out


MESSAGES = _all_messages()


def test_the_scan_sees_the_messages_and_both_parsers():
    # Canaries for the scan itself: it finds refusals that name flags, the parser's flags
    # and vLLM's (where vLLM is installed).
    assert len([m for m in MESSAGES if FLAG.search(m[2])]) > 50
    assert {"--speculative-config", "--acceptance-profile", "--engine-args"} <= OURS
    if importlib.util.find_spec("vllm") is not None:
        assert {"--max-num-seqs", "--max-model-len", "--no-async-scheduling",
                "--api-key"} <= VLLM


def test_every_flag_a_message_names_exists():
    bad = [f"{path}:{line}: {flag} in {text[:120]!r}" for path, line, text in MESSAGES
           for flag in unknown_flags(text)]
    assert not bad, "messages name flags the parser does not have:\n" + "\n".join(bad)


@pytest.mark.parametrize("text, flag", [
    ("--strategy replay needs per-position rates: pass --acceptance-rates FILE",
     "--acceptance-rates"),
    ("use --max-num-seqs 64", "--max-num-seqs"),  # vLLM's flag, but said as the tuner's
])
def test_a_wrong_flag_is_caught(text, flag):
    assert unknown_flags(text) == [flag]


@pytest.mark.parametrize("text", [
    "Install it with `pip install --no-deps arctic-inference`",
    "build the bundle with scripts/gpu_bundle.sh --with-ray",
    "above the engine's --max-num-seqs 8",
    "pass --acceptance-profile FILE",
])
def test_another_programs_flag_in_its_context_is_not_ours_to_have(text):
    if "max-num-seqs" in text and not VLLM:
        pytest.skip("vLLM is not installed here")
    assert unknown_flags(text) == []
