"""Every import of ddptui code resolves, function-local ones included (they run only on their
path: a rank's entry, a dashboard opener), so a moved module cannot hide behind one."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "ddptui").rglob("*.py")) + sorted((ROOT / "trainers").rglob("*.py"))


def ddptui_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in ("ddptui", "trainers"):
                yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("ddptui", "trainers"):
                    yield node.lineno, alias.name, []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_ddptui_import_resolves(path):
    for line, module, names in ddptui_imports(path):
        assert importlib.util.find_spec(module) is not None, f"{path.name}:{line}: {module}"
        for name in names:
            if name == "*":
                continue
            loaded = importlib.import_module(module)
            found = hasattr(loaded, name) or importlib.util.find_spec(f"{module}.{name}")
            assert found, f"{path.name}:{line}: from {module} import {name}"
