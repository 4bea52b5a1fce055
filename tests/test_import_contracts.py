"""Which package may import which: every import statement of the source tree (those inside functions too) is checked."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Contract:
    name: str
    under: tuple[str, ...]  # folders, relative to the root, whose .py files are checked
    forbidden: tuple[str, ...]  # modules (and their submodules) those files must not import
    except_under: tuple[str, ...] = ()


CONTRACTS = (
    Contract("Qt only in app/qt", ("app", "cli", "server", "engine", "kernels"), ("PySide6", "qasync"),
             except_under=("app/qt",)),
    Contract("engine imports no app, server or cli", ("engine",), ("app", "server", "cli")),
    Contract("kernels import nothing of ours", ("kernels",), ("engine", "app", "server", "cli")),
    Contract("the cache knows no model", ("engine/cache",), ("engine.models",)),
    Contract("server imports no app or cli", ("server",), ("app", "cli")),
    Contract("app core imports no app.qt", ("app/core",), ("app.qt",)),
)


def imported(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file; `from a import b` yields a and a.b, relative imports resolved."""
    package = path.relative_to(root).parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] if node.level else ())
            module = ".".join(p for p in (base, node.module or "") if p)
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names if alias.name != "*"]
    return found


def _matches(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(root: Path, contracts: tuple[Contract, ...] = CONTRACTS) -> list[str]:
    """'path:line imports module (contract)' for every import under `root` that breaks one of `contracts`."""
    out = []
    for c in contracts:
        files = sorted({f for folder in c.under for f in (root / folder).rglob("*.py")})
        for f in files:
            rel = f.relative_to(root).as_posix()
            if any(rel.startswith(e.rstrip("/") + "/") for e in c.except_under):
                continue
            seen = set()
            for line, module in imported(f, root):
                if _matches(module, c.forbidden) and line not in seen:
                    seen.add(line)
                    out.append(f"{rel}:{line} imports {module} ({c.name})")
    return out


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name)
def test_contract_holds(contract):
    assert violations(ROOT, (contract,)) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def test_a_broken_contract_is_reported(tmp_path):
    root = _tree(tmp_path, {
        "engine/__init__.py": "",
        "engine/x.py": "from app.qt import window\n",
        "engine/cache/__init__.py": "",
        "engine/cache/pool.py": "import torch\n\ndef f():\n    from ..models import llama\n",
        "app/core/store.py": "from app import qt\n",
        "app/qt/view.py": "from PySide6.QtCore import Signal\n",
        "server/api.py": "def f():\n    import PySide6.QtWidgets\n",
        "kernels/k.py": "from engine.errors import ParleyError\n",
    })
    assert violations(root) == [
        "server/api.py:2 imports PySide6.QtWidgets (Qt only in app/qt)",
        "engine/x.py:1 imports app.qt (engine imports no app, server or cli)",
        "kernels/k.py:1 imports engine.errors (kernels import nothing of ours)",
        "engine/cache/pool.py:4 imports engine.models (the cache knows no model)",
        "app/core/store.py:1 imports app.qt (app core imports no app.qt)",
    ]
