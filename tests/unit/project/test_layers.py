"""The layering of ARCHITECTURE.md, checked by reading every import of the source tree.

Each package may import only the layers below it; an import that breaks this, or a new
package that has no place in the table, fails here with the file and the import named.
Imports inside functions count too: a lazy import is still a dependency.

The lab (`lab/`) is a client of the product, not a layer of it: it may import the product,
and no product module imports it but one, `netagent/cli.py`, lazily inside the `lab`
command's handler (the image ships the product without the lab).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRODUCT_PACKAGES = ("netagent", "cni", "proxy", "ebpf")
SOURCE_PACKAGES = PRODUCT_PACKAGES + ("lab",)
# the one import of the lab from the product: (file, the function it sits in)
LAZY_LAB_IMPORT = ("netagent/cli.py", "_cmd_lab")

BOTTOM = {"netagent.kernel", "netagent.infra", "netagent.kube"}
# layer -> the layers it may import (its own modules always)
ALLOWED: dict[str, set[str]] = {
    "netagent.kernel": set(),
    "netagent.infra": set(),
    "netagent.kube": set(),
    "cni": {"netagent.kernel"},
    "ebpf": {"netagent.kernel", "netagent.infra"},  # infra: pod_veths.py's SyncRunner
    "proxy": BOTTOM | {"ebpf"},
    "netagent.cniserver": {"cni", "netagent.kernel", "netagent.infra"},
    "netagent.noderoutes": BOTTOM,
    "netagent.policy": BOTTOM,
    "netagent.daemon": BOTTOM | {"netagent", "cni", "proxy", "ebpf", "netagent.cniserver", "netagent.noderoutes",
                                 "netagent.policy"},
    # the CLI's import of the lab: only LAZY_LAB_IMPORT (test_no_product_module_imports_the_lab)
    "netagent.cli": BOTTOM | {"netagent", "cni", "proxy", "ebpf", "netagent.cniserver", "netagent.noderoutes",
                              "netagent.policy", "netagent.daemon", "lab"},
    # the lab: a client of the product (what it builds clusters from), never imported by it
    "lab": BOTTOM | {"cni", "proxy", "ebpf", "netagent.cniserver", "netagent.noderoutes", "netagent.policy"},
    "netagent": set(),  # netagent/__init__.py: the version
    "netagent.errors": set(),  # NetagentError, the exceptions' one root
}
EVERY_LAYER_MAY_IMPORT = "netagent.errors"
# inside a layer: package -> the packages of its own layer it must not import
NOT_SIDEWAYS: dict[str, set[str]] = {
    # routing renders every mode (bgp's too, `routing/bgp.py`); the BGP speaker fills its input
    "netagent.noderoutes.routing": {"netagent.noderoutes.bgp"},
    # backends share through the layer below them (proxy/, policy/), never sideways
    "proxy.iptables": {"proxy.ipvs", "proxy.nftables", "proxy.ebpf"},
    "proxy.nftables": {"proxy.iptables", "proxy.ipvs", "proxy.ebpf"},
    "proxy.ebpf": {"proxy.iptables", "proxy.ipvs", "proxy.nftables"},
    "netagent.policy.iptables": {"netagent.policy.nftables"},
    "netagent.policy.nftables": {"netagent.policy.iptables"},
}


def layer_of(module: str) -> str:
    """`netagent.kernel.iptables.fake` -> `netagent.kernel`; `proxy.ipvs.table` -> `proxy`."""
    parts = module.split(".")
    if parts[0] == "netagent" and len(parts) > 1:
        return f"netagent.{parts[1]}"
    return parts[0]


def source_modules() -> list[tuple[str, Path]]:
    found = []
    for package in SOURCE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).with_suffix("")
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            found.append((".".join(parts), path))
    return found


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of our packages in the file."""
    return [(line, name) for line, name, _ in imports_with_function(path)]


def imports_with_function(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, the top-level function it is in or None) of every absolute import of
    our packages in the file."""
    imports = []
    for top in ast.parse(path.read_text(), filename=str(path)).body:
        function = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        for node in ast.walk(top):
            if isinstance(node, ast.Import):
                imports += [(node.lineno, alias.name, function) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imports.append((node.lineno, node.module, function))
                if node.module == "netagent":  # `from netagent import kernel` names a layer
                    imports += [(node.lineno, f"netagent.{alias.name}", function) for alias in node.names
                                if (ROOT / "netagent" / alias.name).exists()]
    return [(line, name, function) for line, name, function in imports if name.split(".")[0] in SOURCE_PACKAGES]


def test_every_module_has_a_layer():
    unplaced = sorted({layer_of(module) for module, _ in source_modules()} - set(ALLOWED))
    assert unplaced == [], f"give these a place in ALLOWED and in ARCHITECTURE.md: {unplaced}"


def test_imports_only_go_down_the_layers():
    violations = []
    for module, path in source_modules():
        source = layer_of(module)
        for line, imported in imported_modules(path):
            target = layer_of(imported)
            if target not in (source, EVERY_LAYER_MAY_IMPORT) and target not in ALLOWED.get(source, set()):
                violations.append(f"{path.relative_to(ROOT)}:{line}: {source} imports {imported}")
    assert violations == [], "imports against the layering:\n" + "\n".join(violations)


def test_no_package_imports_sideways_inside_its_layer():
    """`grep -rn noderoutes.bgp netagent/noderoutes/routing` finds nothing: bgp/ imports routing/."""
    violations = []
    for module, path in source_modules():
        for package, forbidden in NOT_SIDEWAYS.items():
            if module != package and not module.startswith(package + "."):
                continue
            violations += [f"{path.relative_to(ROOT)}:{line}: {module} imports {imported}"
                           for line, imported in imported_modules(path)
                           if any(imported == f or imported.startswith(f + ".") for f in forbidden)]
    assert violations == [], "imports sideways inside a layer:\n" + "\n".join(violations)


def test_the_errors_module_imports_nothing_of_ours():
    """Every layer imports it, so it may import no layer (and no cycle can start there)."""
    assert imported_modules(ROOT / "netagent" / "errors.py") == []


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def lazy():\n    from netagent.daemon.run import main\n")
    assert imported_modules(bad) == [(2, "netagent.daemon.run")]
    assert "netagent.daemon" not in ALLOWED[layer_of("proxy.service_proxy")]


def test_no_product_module_imports_the_lab():
    """`grep -rE '^(from|import) (netagent\\.)?lab' netagent cni proxy ebpf` finds nothing, and
    nothing deeper either: the CLI's lazy import in its `lab` handler is the only one."""
    found = []
    for module, path in source_modules():
        if layer_of(module) == "lab":
            continue
        for line, imported, function in imports_with_function(path):
            if layer_of(imported) == "lab" and (path.relative_to(ROOT).as_posix(), function) != LAZY_LAB_IMPORT:
                found.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {imported}")
    assert found == [], "the product imports the lab (only netagent/cli.py's _cmd_lab may):\n" + "\n".join(found)
    path, function = LAZY_LAB_IMPORT
    assert {f for _, imported, f in imports_with_function(ROOT / path) if layer_of(imported) == "lab"} == {function}


def test_the_checker_sees_a_lab_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import lab.cluster\n\ndef handler():\n    from lab.commands import run_lab_command\n")
    assert imports_with_function(bad) == [(1, "lab.cluster", None), (4, "lab.commands", "handler")]
    assert layer_of("lab.apiserver.store") == "lab"
