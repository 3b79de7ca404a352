"""The import layers of docs/architecture.md: a module imports only its own layer and
the layers below it, and no two modules import each other (not even lazily, inside a
function). Read from the source with ``ast``, so imports inside functions count."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "turnrl"

LAYERS: list[set[str]] = [
    {"errors", "types", "io", "strict_json", "options", "entrypoints", "config_toml"},
    {"records", "record_columns"},
    {"table"},
    {"credit"},
    {"envs"},
    {"policy"},
    {"rollout"},
    {"serve"},
    {"train"},
    {"report"},
    {"study"},
    {"integrations"},
    {"cli", "__main__", "turnrl"},
]
"""Bottom to top, as docs/architecture.md lists them (``turnrl`` is the package's
``__init__``, which re-exports the public names)."""
RANK = {part: rank for rank, layer in enumerate(LAYERS) for part in layer}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in SRC.rglob("*.py")}
PACKAGES = {_module_name(path) for path in SRC.rglob("__init__.py")}


def _imports(module: str) -> Iterator[str]:
    """The turnrl modules ``module`` imports (``from pkg import submodule`` resolved to
    the submodule, a package's own re-exports to the package)."""
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                yield target if target in MODULES else node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer(module: str) -> int:
    return RANK[_top(module)]


def test_every_module_has_a_layer() -> None:
    assert sorted({_top(module) for module in MODULES} - set(RANK)) == []


def test_imports_never_run_back_up() -> None:
    upward = [
        f"{module} imports {target}"
        for module in sorted(MODULES)
        for target in _imports(module)
        if target.startswith("turnrl") and _layer(target) > _layer(module)
    ]
    assert upward == []


def test_no_two_modules_import_each_other() -> None:
    graph = {
        module: {
            target
            for target in _imports(module)
            if target in MODULES and target not in PACKAGES and target != module
        }
        for module in MODULES
        if module not in PACKAGES
    }
    cycles = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            module, path = stack.pop()
            for target in graph[module]:
                if target == start:
                    cycles.append(" -> ".join([*path, start]))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    assert cycles == []


def test_building_the_command_line_imports_no_heavy_library() -> None:
    """Every command's parser is built before any command runs, so registering one must
    not import torch, transformers or matplotlib: the adapter venvs (no ``train`` extra)
    run ``turnrl audit`` and ``turnrl credit``."""
    import subprocess
    import sys

    code = (
        "import sys; from turnrl.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('matplotlib', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
