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


# ---- the whole package: private names, cycles, fixtures -------------------------------------
def _package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _part(module: str) -> str:
    """The layer a module belongs to: ``compiler``, ``runtime``, ``testing``... or a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _private_imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` for every ``from module import _name`` in ``path`` (relative resolved)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                base = ".".join(anchor[: len(anchor) - node.level + 1] + ([base] if base else []))
            found.extend((base, alias.name) for alias in node.names if alias.name.startswith("_"))
    return found


def test_no_layer_imports_a_private_name_of_another() -> None:
    # e.g. the runtime's measurer once compiled with the compiler's private _build
    offending = [
        f"{_module_name(f)} imports {name} from {base}"
        for f in _package_files()
        for base, name in _private_imports(f)
        if base.startswith("tvm_hetero") and _part(base) != _part(_module_name(f))
    ]
    assert offending == []


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at any depth of the file, functions included)."""
    modules = {_module_name(f): f for f in _package_files()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for imported in _imports(path):
            while imported and imported not in modules:  # ``package.module.attr`` -> the module
                imported = imported.rsplit(".", 1)[0] if "." in imported else ""
            if imported and imported != name:
                deps.add(imported)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_import_each_other() -> None:
    # e.g. runtime/graph_runtime.py and runtime/offload.py once did
    graph = _import_graph()
    assert "tvm_hetero.runtime.offload" in graph["tvm_hetero.runtime.graph_runtime"]  # the scan sees imports
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]  # and would see a cycle
    assert _cycles(graph) == []


def test_only_the_cli_and_the_fixtures_import_the_fixtures() -> None:
    offending = {
        _module_name(f): n
        for f in _package_files()
        for n in _imports(f)
        if (n == "tvm_hetero.testing" or n.startswith("tvm_hetero.testing."))
        and _part(_module_name(f)) not in ("testing", "cli")
    }
    assert offending == {}


def _fresh(script: str) -> list[str]:
    """Run ``script`` in a new interpreter; the modules it left loaded (one per line of stdout)."""
    full = script + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", full], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_importing_the_package_loads_no_fixture_and_no_onnx() -> None:
    loaded = _fresh("import tvm_hetero")
    assert "tvm_hetero.artifact" in loaded
    assert [m for m in loaded if m.startswith("tvm_hetero.testing") or m == "onnx"] == []


def test_compile_imports_an_onnx_model_through_the_product_not_the_fixtures(tmp_path) -> None:
    onnx = __import__("pytest").importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(model))
    loaded = _fresh(f"from tvm_hetero import cli\n"
                    f"assert cli.main(['compile', {str(model)!r}, '-o', {str(tmp_path / 'out')!r}]) == 0")
    assert "tvm_hetero.importers" in loaded
    assert [m for m in loaded if m.startswith("tvm_hetero.testing")] == []
