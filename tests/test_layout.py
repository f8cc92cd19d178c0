"""The package's rooms import one way: down the stages, never up, and no module imports itself back.

errors, wording and doc_pages (what every room raises, says and points at) < io < model < write and reader (neither
imports the other) < tools < cli < api. Inside the writer, its sub-rooms likewise: shared < images
< plan < journal < finish < sinks < run (docs/design/writer-rooms.md says why). Imports inside
functions count too, and benchmarks/ has no import circle either.
"""
from __future__ import annotations

import ast
import pathlib

import pytest
from helpers import REPO

RANK = {"errors": 0, "wording": 0, "doc_pages": 0, "native_stderr": 0, "pixel_limit": 0, "io": 1, "model": 2, "write": 3, "reader": 3, "tools": 4, "cli": 5, "api": 6}
PACKAGE = REPO / "beam_prep"
WRITE_RANK = {"shared": 0, "images": 1, "plan": 2, "grow": 3, "journal": 4, "finish": 5, "sinks": 6, "run": 7}
MAX_MODULES = 12  # in one of the writer's sub-rooms


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports, anywhere in its body."""
    top = package.name
    modules = {module_name(p): p for p in package.rglob("*.py")}
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == top:
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    targets.add(whole if whole in modules else node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.split(".")[0] == top}
        found[name] = targets - {name}
    return found


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_room_is_ranked():
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert rooms == set(RANK)


def test_rooms_import_only_downward():
    upward = []
    for module, targets in imports().items():
        mine = room(module)
        for target in targets:
            theirs = room(target)
            if mine is None or theirs is None or theirs == mine:
                continue  # beam_prep itself (its version, its lazy names), or within one room
            if RANK[theirs] >= RANK[mine]:
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(sorted(upward))


@pytest.mark.parametrize("package", [PACKAGE, REPO / "benchmarks"], ids=lambda p: p.name)
def test_no_import_cycles(package):
    graph = imports(package)
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph.get(module, ())):
            if target in path:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def write_room(module: str) -> str | None:
    """A writer module's sub-room (``beam_prep.write.plan.listing`` -> ``plan``); None for the writer's own."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "write" else None


def test_every_writer_room_is_ranked_and_small():
    write = PACKAGE / "write"
    loose = sorted(p.name for p in write.glob("*.py") if p.stem != "__init__")
    assert not loose, f"modules outside the writer's sub-rooms: {loose}"
    rooms = {p.name for p in write.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(WRITE_RANK)
    crowded = {room: n for room in rooms
               if (n := sum(1 for p in (write / room).iterdir()
                            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()))
               > MAX_MODULES}
    assert not crowded, f"sub-rooms over {MAX_MODULES} modules: {crowded}"


def test_writer_rooms_import_only_downward():
    upward = []
    for module, targets in imports().items():
        mine = write_room(module)
        if mine is None:
            continue
        for target in targets:
            theirs = write_room(target)
            if theirs is None or theirs == mine:
                continue
            if WRITE_RANK[theirs] >= WRITE_RANK[mine]:
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(sorted(upward))
