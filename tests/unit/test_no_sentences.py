"""Words only in outputs/ (STYLE.md "Decisions are data"): tuner/search/ and tuner/analysis/
record figures (tuner.records.decisions, tuner.records.selection, ...) and tuner/outputs/
words them. This test fails where a module of search or analysis builds a sentence.

The rule, exactly. In every module under tuner/search/ and tuner/analysis/, a string literal
is a sentence when its text holds four or more words in a row, each separated from the next
by one space, a word being a letter followed by letters, apostrophes or hyphens. The text of
a string literal is a plain str constant (implicitly concatenated pieces are one constant),
or each literal piece of an f-string taken alone (a placeholder ends a run). Not counted:

- docstrings (a module's, a class's, a function's first statement);
- an error message: anything inside the exception expression of a `raise` statement, or
  inside the arguments of a call to a name ending in `Error` (an exception built by a helper
  and raised by its caller). An error raised to the user (ConfigError) or a bug's ValueError
  says what happened where it is checked, with the offending value (STYLE.md "Errors and
  messages").

ALLOWED lists what is left, each entry with why: text matched against vLLM's log or Optuna's
warnings (no sentence of ours), and debt, literal by literal; an entry that no longer matches fails
too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tuner

PACKAGE = Path(tuner.__file__).resolve().parent
SCANNED = ("search", "analysis")
WORDS = re.compile(r"[A-Za-z][A-Za-z'-]*(?: [A-Za-z][A-Za-z'-]*){3}")

# (module path under tuner/, the first characters of the literal's text as `sentences` joins
# it) -> why it stays. Text matched against someone else's output is no sentence of ours; the
# rest is debt, each entry a move to outputs/ still to make.
_LOG_TEXT = "vLLM's own log text, matched to tell a transient start failure, never said"
_DEBT = "debt: "
ALLOWED: dict[tuple[str, str], str] = {
    ("search/study.py", "address already in use"): _LOG_TEXT,
    ("search/study.py", "no cuda gpus are available"): _LOG_TEXT,
    ("search/storage.py", "Heartbeat of storage is supposed"): "Optuna's own warning text, "
        "matched to silence it, never said",
    ("search/storage.py", "JSON but not a journal record"): _DEBT + "why a journal line is "
        "bad, a clause of the ConfigError that refuses the journal and of `tuner repair`'s "
        "list; an enum with its figures for outputs to word",
    ("search/storage.py", "a record Optuna's replay rejects"): _DEBT + "as above",
    ("search/storage.py", ": line {} had lost its line ending"): _DEBT + "the torn tail "
        "mended as a study opens, said through the driver's `say`; an event for outputs",
    ("search/storage.py", ": the last line was torn"): _DEBT + "as above",
    ("search/storage.py", "Study {}: took over the lock"): _DEBT + "a stale driver lock taken "
        "over, said through the driver's `say`; an event for outputs",
    ("search/outcomes.py", "the driver stopped while"): _DEBT + "a Failure's reason as storage "
        "keeps it (the driver_died kind says it; outputs could word the kind)",
    ("analysis/schedule.py", "the schedule is empty"): _DEBT + "validate_schedule's problems, "
        "stored as text in policy.json's schedule_problems; typed problems change that file",
    ("analysis/schedule.py", "entry {} {} is not three integers"): _DEBT + "as above",
    ("analysis/schedule.py", "the first range must start at 1"): _DEBT + "as above",
}


def _exempt(tree: ast.AST) -> set[int]:
    """ids of the nodes the rule does not count: docstrings, and error messages."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                out.add(id(first.value))
        elif isinstance(node, ast.Raise) and node.exc is not None:
            out.update(id(n) for n in ast.walk(node.exc))
        elif isinstance(node, ast.Call) and _callee(node).endswith("Error"):
            out.update(id(n) for arg in (*node.args, *node.keywords) for n in ast.walk(arg))
    return out


def _callee(call: ast.Call) -> str:
    """The called name: `ConfigError` for ConfigError(...) and errors.ConfigError(...)."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else "")


def sentences(source: str) -> list[tuple[int, str]]:
    """(line, literal text) of every literal of `source` the rule counts as a sentence."""
    tree = ast.parse(source)
    exempt = _exempt(tree)
    pieces = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if id(node) in exempt:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in pieces:
            texts = [node.value]
        elif isinstance(node, ast.JoinedStr):
            texts = [v.value for v in node.values if isinstance(v, ast.Constant)]
        else:
            continue
        if any(WORDS.search(t) for t in texts):
            found.append((node.lineno, "{}".join(texts)))
    return sorted(found)


def _found() -> dict[tuple[str, str], int]:
    out = {}
    for stage in SCANNED:
        for path in sorted((PACKAGE / stage).rglob("*.py")):
            rel = path.relative_to(PACKAGE).as_posix()
            for line, text in sentences(path.read_text()):
                out[(rel, text)] = line
    return out


def _allowed(rel: str, text: str) -> tuple[str, str] | None:
    return next((key for key in ALLOWED if key[0] == rel and text.startswith(key[1])), None)


def test_search_and_analysis_build_no_sentence():
    found = _found()
    built = [f"tuner/{rel}:{line}: {text[:80]!r}" for (rel, text), line in found.items()
             if _allowed(rel, text) is None]
    assert not built, ("a sentence built in search/ or analysis/; record the figures and word "
                       "them in tuner/outputs/ (STYLE.md: words only in outputs/):\n"
                       + "\n".join(built))


def test_every_allowed_literal_is_still_there():
    used = {_allowed(rel, text) for rel, text in _found()}
    assert set(ALLOWED) <= used, sorted(set(ALLOWED) - used)


def test_the_rule_sees_sentences_and_passes_labels_docstrings_and_raised_errors():
    source = '''
"""A module docstring of many words is fine."""
LABEL = "ngram k=3 window 1-3"
COLUMNS = ("output_throughput", "mean_tpot_ms")
said = f"Replayed {n} configs over the baseline's tokens"
pieces = f"{a} tok/s ({b:.2f}x) at c={c}"
def f(x):
    """So is a function's."""
    if x:
        raise ValueError(f"entry {x} is not three integers; fix it")
    return "the space looks exhausted; stopping"
def g(x):
    return ConfigError(f"Study {x} is in use by another tuner; wait for it")
def h(x):
    return Note(text=f"Study {x} is in use by another tuner; wait for it")
'''
    assert [line for line, _ in sentences(source)] == [5, 11, 15]
