"""The package's layers: the compiler never imports the runtime side (docs/architecture.md)."""

from __future__ import annotations

import ast
import re
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
        and _part(_module_name(f)) not in ("testing", "cli") and not _module_name(f).endswith(".cli")
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


# ---- one home per vendor, and the parts of the package --------------------------------------
ROOT = Path(__file__).resolve().parents[2]
#: The product's source (the installed package may live elsewhere).
SOURCE = ROOT / "python" / "tvm_hetero"
#: A word naming the first vendor (Qualcomm's QNN, its HTP), in code or comments: not inside another
#: word ("WeightPredicate" is no HTP), in any of its spellings.
VENDOR_WORD = re.compile(r"(?<![A-Za-z])(qnn|QNN|Qnn|htp|HTP|Htp|hexagon|Hexagon)")
#: The vendor's home: its Python package and (none today) its C++ folder.
VENDOR_HOMES = (SOURCE / "qnn", ROOT / "src" / "backends" / "qnn")
#: Outside its home, a vendor may be named by the registry line and the kind records only.
ALLOWED_OUTSIDE = {
    SOURCE / "devices.py": ["VENDOR_PACKAGES = "],  # the registry line
    ROOT / "src" / "support" / "device_kinds.cc": [],  # the C++ kind record (the whole file may name it)
}


def product_files() -> list[Path]:
    files = [p for p in SOURCE.rglob("*.py")]
    for folder in (ROOT / "src", ROOT / "include"):
        files += [p for p in folder.rglob("*") if p.suffix in (".cc", ".h")]
    files += [ROOT / "CMakeLists.txt", *(ROOT / "cmake").glob("*")]
    return sorted(p for p in files if p.is_file())


def test_only_the_vendor_package_names_the_vendor() -> None:
    offenders, outside = [], set()
    for path in product_files():
        if any(home in path.parents for home in VENDOR_HOMES):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not VENDOR_WORD.search(line):
                continue
            allowed = ALLOWED_OUTSIDE.get(path)
            if allowed is not None and (not allowed or any(a in line for a in allowed)):
                outside.add(path)
                continue
            offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "the vendor is named outside its home:\n" + "\n".join(offenders)
    assert len(outside) <= 3, outside


def _absolute_imports(path: Path) -> set[str]:
    """The tvm_hetero modules ``path`` imports (absolute names), at any depth of the file."""
    module = ".".join(path.relative_to(SOURCE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if path.name == "__init__.py":
        module = package
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("tvm_hetero"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("tvm_hetero"):
                out.add(name)
                out.update(f"{name}.{a.name}" for a in node.names)
    return out


def test_the_runtime_does_not_import_the_compiler() -> None:
    for path in sorted((SOURCE / "runtime").rglob("*.py")):
        bad = sorted(m for m in _absolute_imports(path) if m.startswith("tvm_hetero.compiler"))
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_no_import_cycle_among_the_top_level_parts() -> None:
    """Arrows point down between the package's parts (runtime, compiler, backends, the generic
    offload path, the vendors): a cycle between two of them is an error. Imports inside functions
    count too, bar the ones the kind record resolves by name (they are the point of the record)."""
    parts = ("runtime", "compiler", "backends", "ep_offload", "qnn")

    def part(module: str) -> str | None:
        pieces = module.split(".")
        return pieces[1] if len(pieces) > 1 and pieces[1] in parts else None

    edges: dict[str, set[str]] = {p: set() for p in parts}
    for path in SOURCE.rglob("*.py"):
        source = part(".".join(path.relative_to(SOURCE.parent).with_suffix("").parts))
        if source is None:
            continue
        for target in map(part, _absolute_imports(path)):
            if target is not None and target != source:
                edges[source].add(target)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in edges[start])

    cycles = [(a, b) for a in parts for b in edges[a] if reaches(b, a, {b})]
    assert not cycles, f"import cycles between parts: {cycles} (edges {edges})"
    assert "qnn" not in set().union(*(edges[p] for p in parts if p != "qnn")), "a part imports the vendor's package"
