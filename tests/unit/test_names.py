"""One name per concept (issue 48): a record's name means one thing across tuner/, and the
words "verdict" and "aligned baseline" each name one concept. Old studies still read: a stored
key that was renamed is read back through tuner.records.migrations.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import tuner
from tuner.records import migrations
from tuner.records.policy import PolicyDocument
from tuner.records.trials import Role

PACKAGE = Path(tuner.__file__).resolve().parent
GOLDEN_POLICY = PACKAGE.parent / "tests" / "data" / "golden" / "optuna_tpe" / "policy.json"


def _definitions() -> dict[str, list[str]]:
    """Top-level class and type-alias names of every module, by name."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = ([node.name] if isinstance(node, ast.ClassDef) else
                     [t.id for t in node.targets if isinstance(t, ast.Name)]
                     if isinstance(node, ast.Assign) else [])
            for name in names:
                found.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    return found


def test_aligned_baseline_and_verification_each_name_one_record():
    defs = _definitions()
    # The --aligned-baseline choice the search reads; the ladder's path-cost curve has its own.
    assert defs["AlignedBaseline"] == ["records/configs.py"]
    assert defs["PathCostCurve"] == ["records/policy.py"]
    # `tuner verify`'s record; the policy's check of its schedule on the ladder has its own.
    assert defs["Verification"] == ["records/verification.py"]
    assert defs["ScheduleVerification"] == ["records/policy.py"]


def test_verdict_names_the_recommendations_verdict_record_only():
    """A definition named after "verdict" (a class, function, field or argument) is the Verdict
    record, a value of it, or its words (outputs/verdicts.py). search/ is left out: its ranking
    is restructured apart (issue 48, item 1)."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith("search/") or rel == "outputs/verdicts.py":
            continue
        tree = ast.parse(path.read_text())
        holds_verdicts = any(isinstance(n, ast.ClassDef) and n.name == "Verdict" or
                             isinstance(n, ast.ImportFrom) and any(
                                 a.name == "Verdict" for a in n.names) for n in ast.walk(tree))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                name = node.name
                ok = name == "Verdict"
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name = node.target.id
                ok = ast.unparse(node.annotation) == "Verdict"
            elif isinstance(node, ast.arg) or isinstance(node, ast.Name) and isinstance(
                    node.ctx, ast.Store):  # an argument or a variable, not a reference
                name = node.arg if isinstance(node, ast.arg) else node.id
                ok = holds_verdicts
            else:
                continue
            if "verdict" in name.lower() and not ok:
                bad.append(f"{rel}: {name}")
    assert not bad, bad


def test_a_policy_json_stored_before_the_headline_reads_back_the_same():
    now = json.loads(GOLDEN_POLICY.read_text())
    assert "headline" in now and "headline" in now["verification"]
    back = {new: old_key for old_key, new in migrations.OLD_POLICY_KEYS.items()}
    old = {back.get(k, k): v for k, v in now.items()}
    old["verification"] = {back.get(k, k): v for k, v in now["verification"].items()}
    assert "verdict" in old and "headline" not in old["verification"]
    doc = PolicyDocument.model_validate(old)
    assert doc == PolicyDocument.model_validate(now)
    assert doc.headline == now["headline"]
    assert doc.verification.headline == now["verification"]["headline"]
    assert "verdict" not in json.dumps(doc.model_dump())  # written back under the new key


def test_ladder_roles_are_roles():
    doc = PolicyDocument.model_validate(json.loads(GOLDEN_POLICY.read_text()))
    assert {c.role for c in doc.configs} <= set(Role)
    assert all(isinstance(c.role, Role) for c in doc.configs)
