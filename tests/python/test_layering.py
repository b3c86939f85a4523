"""The package's layers, checked from the source: one home per vendor, a runtime that does not know
the compiler, no import cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "tvm_hetero"
#: A word naming the first vendor (Qualcomm's QNN, its HTP), in code or comments: not inside another
#: word ("WeightPredicate" is no HTP), in any of its spellings.
VENDOR_WORD = re.compile(r"(?<![A-Za-z])(qnn|QNN|Qnn|htp|HTP|Htp|hexagon|Hexagon)")
#: The vendor's home: its Python package and (none today) its C++ folder.
VENDOR_HOMES = (PACKAGE / "qnn", ROOT / "src" / "backends" / "qnn")
#: Outside its home, a vendor may be named by the registry line and the kind records only.
ALLOWED_OUTSIDE = {
    PACKAGE / "devices.py": ["VENDOR_PACKAGES = "],  # the registry line
    ROOT / "src" / "support" / "device_kinds.cc": [],  # the C++ kind record (the whole file may name it)
}


def product_files() -> list[Path]:
    files = [p for p in PACKAGE.rglob("*.py")]
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


def _imports(path: Path) -> set[str]:
    """The tvm_hetero modules ``path`` imports (absolute names), at any depth of the file."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
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
    for path in sorted((PACKAGE / "runtime").rglob("*.py")):
        bad = sorted(m for m in _imports(path) if m.startswith("tvm_hetero.compiler"))
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
    for path in PACKAGE.rglob("*.py"):
        source = part(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        if source is None:
            continue
        for target in map(part, _imports(path)):
            if target is not None and target != source:
                edges[source].add(target)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in edges[start])

    cycles = [(a, b) for a in parts for b in edges[a] if reaches(b, a, {b})]
    assert not cycles, f"import cycles between parts: {cycles} (edges {edges})"
    assert "qnn" not in set().union(*(edges[p] for p in parts if p != "qnn")), "a part imports the vendor's package"
