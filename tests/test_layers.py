"""The three packages and their layers: ``fedlib`` (the library) imports neither ``studies`` (the
papers) nor ``lab`` (the tooling that operates on them); ``studies`` does not import ``lab``; no
module imports another in a circle; and every library module imports in a process where the two
packages above it cannot be imported at all."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedlib", "studies", "lab")
#: What each package may import of the project: only the packages below it.
BELOW = {"fedlib": set(), "studies": {"fedlib"}, "lab": {"fedlib", "studies"}}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports, anywhere in its body (a function-level import
    counts: it runs sooner or later). ``from pkg import name`` is an import of ``pkg.name`` when that
    is a module, else of ``pkg``."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                r = resolve(t)
                if r is not None and r != mod:
                    graph[mod].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_package_imports_from_one_above_it():
    wrong = [(m, t) for m, ts in import_graph().items() for t in ts
             if t.split(".")[0] != m.split(".")[0] and t.split(".")[0] not in BELOW[m.split(".")[0]]]
    assert not wrong, wrong


def test_no_import_cycle_between_modules():
    graph = import_graph()
    assert len(graph) > 50
    assert not cycles(graph)


def test_no_shim_modules():
    """A module that defines nothing (no function, no class) and imports from the project is an
    alias kept for an old path: commands and names live at one path."""
    defines = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    shims = []
    for mod, path in modules().items():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        tree = ast.parse(path.read_text())
        project = [n for n in tree.body
                   if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(PACKAGES)]
        if project and not any(isinstance(n, defines) for n in tree.body):
            shims.append(mod)
    assert not shims, shims


@pytest.mark.e2e
def test_every_library_module_imports_alone_without_studies_or_lab():
    """Each module of fedlib is imported first, in a process where ``studies`` and ``lab`` cannot be
    imported (a meta-path finder refuses them); between modules the project's modules are dropped from
    ``sys.modules`` (third-party ones stay loaded, to keep it fast). The same for ``studies`` without
    ``lab``."""
    import fedlib
    import studies

    for pkg, refused in ((fedlib, ("studies", "lab")), (studies, ("lab",))):
        names = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
                 if not m.name.endswith("__main__")]
        code = (
            "import importlib, importlib.abc, sys\n"
            f"REFUSED = {refused!r}\n"
            "class Refuse(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in REFUSED:\n"
            "            raise ModuleNotFoundError(f'refused: {name}')\n"
            "sys.meta_path.insert(0, Refuse())\n"
            "for n in sys.argv[1:]:\n"
            "    for k in [k for k in sys.modules if k.split('.')[0] in ('fedlib', 'studies', 'lab')]:\n"
            "        del sys.modules[k]\n"
            "    try:\n"
            "        importlib.import_module(n)\n"
            "    except Exception as e:\n"
            "        print(n, repr(e)); sys.exit(1)\n"
        )
        out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                             timeout=600, cwd=ROOT)
        assert out.returncode == 0, out.stdout[-1500:] + out.stderr[-1500:]
        assert len(names) > 15
