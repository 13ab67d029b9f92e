"""The package's structure is part of the product: imports point one way.

    cli -> api -> {search, measure, replay, analysis, outputs} -> {checks, engine_cmdline}
        -> records, errors, tokens, speculative, intervals

cli imports only api, records, errors, checks and outputs.console: it parses the command line
into options records, makes one api call and prints. measure knows nothing of Optuna or Ray;
search may run measure (its executors launch trials) and replay (the replay strategy predicts
before it launches); replay runs vLLM's proposers over recorded tokens and knows no engine,
storage or sampler; analysis never touches an engine (no measure, no vLLM); outputs render
what analysis computed (no measure, no search); checks imports no stage (tuner.api resolves
the embedded model and probes the machine, and hands checks the answers); nothing imports
api or cli; records, errors, tokens (the token capture every stage may pass on),
speculative (what vLLM's SpeculativeConfig accepts, which checks and search both check names
against) and intervals (the speedup intervals the search stops on and the analysis
recommends by) import no stage. No exception is whitelisted. Every import counts, including the
ones inside functions (heavy imports are deferred there, and that is where layering slips).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tuner

PACKAGE = Path(tuner.__file__).resolve().parent
STAGES = ("measure", "replay", "search", "analysis", "outputs", "testing")

# Base modules: any module may import them (unless FORBIDDEN names one), and they import no
# other tuner module.
BASE = ("records", "errors", "tokens", "speculative", "intervals")
# module group -> tuner groups it must never import
FORBIDDEN = {
    "records": {"*"},
    "errors": {"*"},
    "tokens": {"*"},
    "speculative": {"*"},
    "intervals": {"*"},
    "engine_cmdline": {"api", "cli", "checks", *STAGES},
    "checks": {"api", "cli", "measure", "replay", "search", "analysis", "outputs", "testing"},
    "measure": {"api", "cli", "replay", "search", "analysis", "outputs", "testing"},
    "replay": {"api", "cli", "checks", "measure", "search", "analysis", "outputs", "testing"},
    "search": {"api", "cli", "analysis", "outputs", "testing"},
    # speculative may import vLLM: analysis never touches it.
    "analysis": {"api", "cli", "checks", "measure", "replay", "search", "outputs", "testing",
                 "speculative"},
    "outputs": {"api", "cli", "checks", "measure", "replay", "search", "testing"},
    "testing": {"api", "cli", "checks", "replay", "search", "analysis", "outputs"},
    "api": {"cli", "testing"},
    "cli": {"testing"},
}
# third-party packages a group must never import
FORBIDDEN_THIRD_PARTY = {
    "measure": {"optuna", "ray"},
    "analysis": {"vllm", "ray"},
    "replay": {"optuna", "ray"},
    "records": {"optuna", "ray", "vllm", "pandas"},
    "tokens": {"optuna", "ray", "vllm", "pandas"},
    # It reads vLLM's source and imports vLLM only where the source does not say.
    "speculative": {"optuna", "ray", "pandas"},
}


def _group(module: str) -> str:
    """tuner.measure.engine -> measure; tuner.cli -> cli; tuner -> tuner."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out[name] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    """Every module name imported anywhere in the file, resolved to absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # `from tuner import api` imports the module tuner.api
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


EDGES = {name: _imports(name, path) for name, path in _modules().items()}


def test_the_layout_has_its_stage_folders():
    for stage in STAGES:
        assert (PACKAGE / stage / "__init__.py").is_file(), stage
    for top in ("errors", "tokens", "engine_cmdline"):
        assert (PACKAGE / f"{top}.py").is_file(), top
    # What vLLM's SpeculativeConfig accepts, by concern (a base package: it imports no stage).
    for concern in ("schema", "config_check", "schedule_rules", "proposer_settings"):
        assert (PACKAGE / "speculative" / f"{concern}.py").is_file(), concern
    # The checks, by concern (a package, as the records are).
    for concern in ("bounds", "converters", "files", "engine", "spec_config", "plans"):
        assert (PACKAGE / "checks" / f"{concern}.py").is_file(), concern
    # The orchestrator, with the policy pipeline as a module of its own.
    assert (PACKAGE / "api" / "policy_pipeline.py").is_file()
    # The command line: a table of commands, each module beside the options record it fills.
    for command in ("bench", "optimize", "report", "policy", "recommend", "verify", "predict",
                    "repair"):
        assert (PACKAGE / "cli" / f"{command}.py").is_file(), command
    # The records, by concern: what is asked, what was measured, why a trial stands in a study,
    # the split of a speedup, what analysis recommends, the options of each command, the
    # storage contract and the old keys it still reads.
    for concern in ("configs", "results", "trials", "speedup", "recommendations", "options",
                    "storage", "migrations"):
        assert (PACKAGE / "records" / f"{concern}.py").is_file(), concern


@pytest.mark.parametrize("module", sorted(EDGES))
def test_imports_point_one_way(module):
    group = _group(module)
    banned = FORBIDDEN.get(group, set())
    bad = []
    for target in EDGES[module]:
        if target.startswith("tuner.") and target.count(".") >= 1:
            tgroup = _group(target)
            if tgroup == group or (tgroup in BASE and tgroup not in banned):
                continue
            if "*" in banned or tgroup in banned:
                bad.append(target)
        top = target.split(".")[0]
        if top in FORBIDDEN_THIRD_PARTY.get(group, set()):
            bad.append(target)
    assert not bad, f"{module} imports {sorted(set(bad))}, against the one-way layout"


# What the command line may import: it parses into options records, makes one api call and
# prints; every check and default is tuner.checks', every stage is reached through tuner.api.
CLI_IMPORTS = {"tuner.api", "tuner.records", "tuner.errors", "tuner.checks",
               "tuner.outputs.console"}


def test_the_cli_imports_only_the_api_records_errors_checks_and_the_console():
    modules = [m for m in EDGES if _group(m) == "cli"]
    assert len(modules) > 1  # the table of commands and their modules
    ours = {t for m in modules for t in EDGES[m] if t == "tuner" or t.startswith("tuner.")}
    # `from tuner import api` names the package too, `from tuner.records import X` the name X.
    bad = [t for t in ours if t not in ("tuner", "tuner.outputs") and not any(
        t == m or t.startswith(m + ".") for m in (*CLI_IMPORTS, "tuner.cli"))]
    assert not bad, f"tuner.cli imports {sorted(bad)}; reach stages through tuner.api"
    assert {"tuner.api", "tuner.checks"} <= ours


def test_checks_imports_no_stage():
    modules = [m for m in EDGES if _group(m) == "checks"]
    assert len(modules) > 1  # the package and its modules
    stages = {t for m in modules for t in EDGES[m] if _group(t) in STAGES}
    assert not stages, sorted(stages)


def test_nothing_imports_api_or_cli():
    for module, targets in EDGES.items():
        allowed = ({"tuner.api", "tuner.cli"} if _group(module) == "cli" else
                   {"tuner.api"} if _group(module) == "api" else
                   {"tuner.cli"} if module == "tuner.__main__" else set())
        assert not ({"tuner.api", "tuner.cli"} & targets) - allowed, module


def test_the_checker_sees_function_level_imports():
    # A canary for the checker itself: api imports stage modules inside functions too.
    assert any(t.startswith("tuner.search") for t in EDGES["tuner.api"])


def _resolve(target: str) -> str | None:
    """The tuner module an import names: `tuner.search.loop.SearchLoop` -> tuner.search.loop."""
    while target and target not in EDGES:
        target = target.rpartition(".")[0]
    return target or None


def _module_imports(module: str, path: Path) -> set[str]:
    """The tuner modules `module` imports. `from pkg import mod` imports pkg.mod, not what
    pkg/__init__.py imports: the package's own imports are its own edges."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in EDGES else base
                     for a in node.names]
        else:
            continue
        found.update(r for name in names if (r := _resolve(name)) is not None)
    return found


GRAPH = {name: _module_imports(name, path) for name, path in _modules().items()}


def _cycles() -> list[list[str]]:
    """Every import cycle among tuner's modules (Tarjan's strongly connected components of
    more than one module, or one that imports itself)."""
    graph = {m: sorted(targets) for m, targets in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                component.append(n)
                if n == m:
                    break
            if len(component) > 1 or m in graph[m]:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


def test_no_import_cycle_inside_tuner():
    # TYPE_CHECKING imports count: a cycle there is the same knot, only deferred.
    assert _cycles() == []


def test_the_cycle_check_sees_a_cycle(monkeypatch):
    # A canary for the check itself: errors importing api closes a loop (api imports errors).
    monkeypatch.setitem(GRAPH, "tuner.errors", GRAPH["tuner.errors"] | {"tuner.api"})
    assert any({"tuner.errors", "tuner.api"} <= set(c) for c in _cycles())


def test_only_the_storage_module_reads_a_trials_raw_attrs_in_search():
    # tuner.search.study.stored parses a trial's attrs once into a StoredTrial (ladder_run a
    # campaign's run); the rest of the search reads those records, never the raw keys.
    bad = [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
           for path in sorted((PACKAGE / "search").rglob("*.py")) if path.name != "study.py"
           for n, line in enumerate(path.read_text().splitlines(), 1)
           if ".user_attrs" in line]
    assert not bad, "raw user_attrs reads outside tuner/search/study.py:\n" + "\n".join(bad)


def test_no_module_of_tuner_exceeds_500_lines():
    # A module past 500 lines holds a second job (STYLE.md: split when one appears).
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
