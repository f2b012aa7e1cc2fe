"""The house rules of ../shared/DESIGN.md (section "Layout"): the arrows between rooms that must
never exist. Every import of every module counts, including those inside functions."""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autopar"

# room -> (modules it may import from autopar, or None for any) and (rooms it must not import)
ALLOWED_ONLY = {
    "ir": ("autopar.ir", "autopar.errors", "autopar.units"),  # core types know no pass, target or API
}
FORBIDDEN = {
    "passes": ("autopar.backends", "autopar.runtime", "autopar.inspect"),  # planning knows no target
    "solvers": ("autopar.backends", "autopar.runtime", "autopar.inspect"),
    "planning": ("autopar.backends", "autopar.runtime", "autopar.inspect"),
    "backends": ("autopar.passes", "autopar.solvers"),  # printing never re-plans
    "runtime": ("autopar.capture", "autopar.passes", "autopar.solvers"),  # running never plans
    "cost_models": ("autopar.passes",),
}
# the public face: no room below it imports it back
PUBLIC_FACE = ("autopar.api", "autopar.parallelize", "autopar.check", "autopar.baseline_plans", "autopar.cli")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool):
    """(line, dotted name) of every import in ``tree``, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:  # `from autopar import api` imports autopar.api
                yield node.lineno, f"{stem}.{alias.name}" if stem == "autopar" else stem


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def forbidden_imports(root: Path = PACKAGE) -> list[str]:
    """Every forbidden arrow under ``root`` (the autopar package) as 'file:line: a -> b (why)'."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        room = module.split(".")[1] if module.count(".") >= 1 and (root / module.split(".")[1]).is_dir() else None
        imports = _imported(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py")
        for line, name in sorted(imports):
            if not _within(name, ("autopar",)):
                continue
            where = f"{path.relative_to(root.parent)}:{line}: {module} imports {name}"
            if room in ALLOWED_ONLY and not _within(name, ALLOWED_ONLY[room]):
                found.append(f"{where} (autopar/{room}/ may import only {', '.join(ALLOWED_ONLY[room])})")
            if room in FORBIDDEN and _within(name, FORBIDDEN[room]):
                found.append(f"{where} (autopar/{room}/ must not import {name.split('.')[1]}/)")
            if room is not None and _within(name, PUBLIC_FACE):
                found.append(f"{where} (a room of the package must not import the public face)")
    return found


def test_no_forbidden_arrow_exists():
    assert forbidden_imports() == []


def test_a_planted_forbidden_import_is_caught_with_its_file_and_line(tmp_path):
    copy = tmp_path / "autopar"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "passes" / "predict.py"
    lines = target.read_text().splitlines()
    # inside a function, and relative: both must count
    lines += ["", "", "def _planted():", "    from ..backends.torch import codegen", "    return codegen"]
    target.write_text("\n".join(lines) + "\n")
    (copy / "ir" / "planted.py").write_text("import autopar.passes.base\n")
    found = forbidden_imports(copy)
    assert found == [
        "autopar/ir/planted.py:1: autopar.ir.planted imports autopar.passes.base "
        "(autopar/ir/ may import only autopar.ir, autopar.errors, autopar.units)",
        f"autopar/passes/predict.py:{len(lines) - 1}: autopar.passes.predict imports autopar.backends.torch "
        f"(autopar/passes/ must not import backends/)",
    ]


def test_the_architecture_page_states_these_rules():
    """docs/architecture.md's table of forbidden arrows is these rules, no more, no less."""
    import re

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = page.split("<!-- layering rules")[1].split("\n\n")[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and (cells[0].startswith("`") or cells[0] == "every room"):
            rows[cells[0].strip("`").rstrip("/")] = tuple(re.findall(r"`(autopar[\w.]*)`", cells[1]))
    assert {room: rows.pop(room) for room in ALLOWED_ONLY} == ALLOWED_ONLY
    assert rows.pop("every room") == PUBLIC_FACE
    assert rows == FORBIDDEN


def test_importing_autopar_loads_no_dynamo():
    """`import autopar` stays clear of Dynamo (half a second in every torchrun rank and CLI
    process): graph breaks are made when a compiled program's objects are first built."""
    import subprocess
    import sys

    probe = "import sys, autopar; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
