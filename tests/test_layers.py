"""The layout's rules, checked on the source: imports flow downward only, grpc
and the generated protobuf stay in brain/api, no module reaches into another
module's underscore names, no modules import each other (in brain/ and in the
native transport's native/src), and docs/architecture.md's map names every
module.

Each check parses the code (every import, also those inside functions), so a
violation fails here with the file and line, before a reviewer has to find it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BRAIN = REPO / "brain"

# Bottom to top: a unit may import units of a lower rank (and itself), never
# one of its own rank or above.  A unit is a package under brain/ or a
# top-level module.
LAYERS: list[tuple[str, ...]] = [
    ("etcd_version", "progress", "logging_setup", "clock", "failpoints", "thread_names", "protowire",
     "go_duration"),  # facts and helpers, no brain imports
    ("journal", "backend"),                          # durability and value stores
    ("mvcc",),                                       # the core, no I/O
    ("engine",),                                     # threads, files, roles
    ("config",),                                     # the server's settings, checked with the engine's parsers
    ("migrate", "metrics"),                          # etcd's formats; what a scrape reads
    ("cluster",),                                    # replicas on a shared journal
    ("api",),                                        # gRPC, protobuf, the transports
    ("cli",),                                        # commands and start-up wiring
    ("__main__",),
]
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}

# Third-party names only the API layer may import.
API_ONLY = ("grpc", "google.protobuf", "brain.api.pb", "brain._transport")

# Private names reached from outside their module on purpose, with the reason.
ALLOWED_PRIVATE = {
    "os._exit": "the second signal exits without draining, as etcd does",
    "self.nc._server_pool": "nats-py exposes the server it is connected to nowhere else",
}


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    target: str  # the absolute module name imported (for `from X import y`, X.y when y is a module)


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> list[Path]:
    return sorted(p for p in BRAIN.rglob("*.py") if "pb" not in p.relative_to(BRAIN).parts)


def _imports(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                is_module = (REPO / Path(*sub.split("."))).with_suffix(".py").is_file() or (
                    REPO / Path(*sub.split("."))).is_dir()
                found.append(Import(path, node.lineno, sub if is_module else module))
    return found


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "brain" or len(parts) == 1:
        return None
    if parts[1] == "_transport":  # the native transport, built from native/: part of api
        return "api"
    return parts[1]


def test_every_unit_has_a_layer() -> None:
    units = {p.stem if p.is_file() else p.name for p in BRAIN.iterdir()
             if (p.is_file() and p.suffix == ".py" and p.name != "__init__.py")
             or (p.is_dir() and (p / "__init__.py").is_file())}
    assert units == set(RANK), f"units without a layer: {sorted(units - set(RANK))}; " \
                               f"layers without a unit: {sorted(set(RANK) - units)}"


def test_imports_flow_downward() -> None:
    wrong = []
    for path in _sources():
        here = _unit(_module_name(path))
        if here is None:  # brain/__init__.py
            continue
        for imp in _imports(path):
            there = _unit(imp.target)
            if there is None or there == here:
                continue
            if RANK[there] >= RANK[here]:
                wrong.append(f"{imp.path.relative_to(REPO)}:{imp.line}: {here} imports {imp.target} ({there})")
    assert not wrong, "imports that do not flow downward:\n" + "\n".join(wrong)


def test_grpc_and_protobuf_stay_in_api() -> None:
    wrong = []
    for path in _sources():
        if _unit(_module_name(path)) == "api":
            continue
        for imp in _imports(path):
            if any(imp.target == m or imp.target.startswith(m + ".") for m in API_ONLY):
                wrong.append(f"{imp.path.relative_to(REPO)}:{imp.line}: {imp.target}")
    assert not wrong, "grpc/protobuf outside brain/api:\n" + "\n".join(wrong)


def _defined_private_names(tree: ast.AST) -> set[str]:
    """Underscore names this module defines: functions, classes, attributes it
    assigns (self._x = ...), class-level names and dataclass fields."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_reaches_into_another_modules_private_names() -> None:
    wrong = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        own = _defined_private_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        wrong.append(f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import {a.name}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue  # its own object (own or inherited state)
                text = ast.unparse(node)
                if node.attr in own or text in ALLOWED_PRIVATE:
                    continue  # the module's own name, on another instance of its own classes
                wrong.append(f"{path.relative_to(REPO)}:{node.lineno}: {text}")
    assert not wrong, "private names reached from another module:\n" + "\n".join(wrong)


def test_architecture_map_names_every_module() -> None:
    """docs/architecture.md opens with the map: every package and module of
    brain/ on a line of its own (the generated protobuf aside)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    start = text.index("## The map")
    block = text[start:text.index("\n## ", start + 1)]
    named = {n for n in re.findall(r"`(brain/[\w/]+(?:\.py)?/?)`", block) if not n.startswith("brain/api/pb")}
    expected = set()
    for path in _sources():
        rel = path.relative_to(REPO)
        if path.name == "__init__.py":
            if path.parent != BRAIN:
                expected.add(f"{rel.parent}/")
        elif path.name != "__main__.py":
            expected.add(str(rel))
    missing, stale = sorted(expected - named), sorted(named - expected)
    assert not missing and not stale, f"not in the map: {missing}; in the map but gone: {stale}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of nodes that reach each other along ``graph``'s edges
    (each a sorted list of two or more), sorted."""
    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reach = {node: reachable(node) for node in graph}
    groups = {tuple(sorted(n for n in reach[node] if node in reach[n])) for node in graph if node in reach[node]}
    return sorted(list(g) for g in groups)


def test_no_modules_of_brain_import_each_other() -> None:
    """No module of brain/ imports itself through others: every import
    counts, at the top, inside a function or under TYPE_CHECKING, as the
    other checks count them (a Protocol in a leaf module breaks a circle that
    type hints would close: brain/engine/committer_core.py).  A package's
    __init__ is a module of its own; an import of a package's module is not
    counted as an import of that package's __init__, which Python runs first
    (else every package that re-exports its modules would close a circle
    with each of them).  Nothing else is left out."""
    modules = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    lines: dict[tuple[str, str], str] = {}
    for module, path in modules.items():
        for imp in _imports(path):
            target = imp.target
            while target and target not in modules:  # brain.x.y.Name -> brain.x.y
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
                lines.setdefault((module, target), f"{path.relative_to(REPO)}:{imp.line}")
    wrong = []
    for group in _circles(graph):
        inside = sorted(f"{lines[(a, b)]}: {a} imports {b}" for a in group for b in graph[a] if b in group)
        wrong.append(" <-> ".join(group) + "\n    " + "\n    ".join(inside))
    assert not wrong, "modules that import each other:\n" + "\n".join(wrong)


NATIVE_SRC = REPO / "native" / "src"


def test_no_native_modules_use_each_other() -> None:
    """The same for the Rust transport's modules (native/src/*.rs, lib.rs the
    crate root): module a uses module b when a names ``crate::b`` (or
    ``$crate::b`` in a macro) outside a comment, in a use line or a path;
    the root uses the modules whose paths it names.  ``super::`` is left
    out: here only a file's own test module uses it, for that file's
    module."""
    files = {p.stem: p for p in NATIVE_SRC.glob("*.rs")}
    modules = set(files) - {"lib"}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        code = "\n".join(line.split("//", 1)[0] for line in path.read_text().splitlines())
        used = set(re.findall(r"\bcrate::(\w+)", code))
        for group in re.findall(r"\bcrate::\{([^}]*)\}", code):  # use crate::{a::X, b}
            used |= {item.strip().split("::")[0] for item in group.split(",") if item.strip()}
        if name == "lib":
            used |= set(re.findall(r"\b(\w+)::", code)) & modules
        graph[name] = {u if u in modules else "lib" for u in used} - {name}
    circles = _circles(graph)
    assert not circles, f"native/src modules that use each other: {circles}"
