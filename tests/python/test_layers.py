"""The package's layers: the compiler never imports the runtime side (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import tvm_hetero

PACKAGE = Path(tvm_hetero.__file__).resolve().parent
#: What the compiler must not import: the runtime, the layers above it, fixtures, the CLI, and
#: the old top-level names of runtime modules.
FORBIDDEN = (
    "tvm_hetero.runtime",
    "tvm_hetero.artifact",
    "tvm_hetero.pipeline",
    "tvm_hetero.testing",
    "tvm_hetero.cli",
    "tvm_hetero.graph_runtime",
    "tvm_hetero.pipeline_runtime",
    "tvm_hetero.offload",
    "tvm_hetero.rpc",
    "tvm_hetero.timeline",
    "tvm_hetero.models",
)
COMPILER_SIDE = ("compiler", "backends")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return names


def _compiler_files() -> list[Path]:
    return sorted(f for side in COMPILER_SIDE for f in (PACKAGE / side).rglob("*.py"))


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_no_compiler_module_imports_the_runtime_side() -> None:
    files = _compiler_files()
    assert len(files) > 10, files  # the scan sees the package
    offending = {str(f.relative_to(PACKAGE)): n for f in files for n in _imports(f) if _forbidden(n)}
    assert offending == {}


def test_the_scan_sees_a_forbidden_import() -> None:
    # The artifact layer imports the runtime; the same scan must report it.
    assert any(_forbidden(n) for n in _imports(PACKAGE / "artifact.py"))
    assert "tvm_hetero.runtime.graph_runtime" in _imports(PACKAGE / "artifact.py")


def test_importing_every_compiler_module_loads_no_runtime_module() -> None:
    """In a fresh interpreter, with the package's own __init__ (which loads everything) skipped."""
    modules = [_module_name(f) for f in _compiler_files()]
    script = textwrap.dedent(
        f"""
        import importlib, sys, types
        package = types.ModuleType("tvm_hetero")
        package.__path__ = [{str(PACKAGE)!r}]
        sys.modules["tvm_hetero"] = package
        for name in {modules!r}:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.startswith("tvm_hetero."))
        print("\\n".join(loaded))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert "tvm_hetero.compiler.build" in loaded
    assert [m for m in loaded if _forbidden(m)] == []
