"""ARCHITECTURE.md's conventions, held against the code so they stay true: every module of the
product and the lab opens with a docstring and stays under 500 lines, and a boolean flag is
keyword-only (a positional `True` at a call site says nothing; a function whose one subject is
a bool, an encoder of one, is not flagged)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("netagent", "cni", "proxy", "ebpf", "lab")
MODULES = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
MAX_LINES = 500


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_opens_with_its_docstring_and_stays_small(path: Path) -> None:
    source = path.read_text()
    assert ast.get_docstring(ast.parse(source)), "no module docstring saying what it owns and why"
    assert len(source.splitlines()) <= MAX_LINES


def test_boolean_flags_are_keyword_only() -> None:
    positional = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [a for a in [*node.args.posonlyargs, *node.args.args] if a.arg not in ("self", "cls")]
                for arg in args if len(args) > 1 else []:
                    if arg.annotation is not None and ast.unparse(arg.annotation) in ("bool", "bool | None"):
                        positional.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({arg.arg})")
    assert positional == []
