"""Objects named in a config as ``module:name`` or ``path/to/file.py:name``.

Agents (``agent.entrypoint``, ``warm_start.teacher``) and environments
(``env.name = "mypkg.envs:make_env"``) are named this way, so user code joins a run
without editing turnrl. Loading imports user code, nothing is evaluated: the
module is imported (the current directory is on the path while it is) or the file
is executed as a module, and the attribute is looked up by name. Every failure is
an error of the caller's type naming the config option and what went wrong.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

from turnrl.errors import ConfigError

ENTRYPOINT_FORMAT = re.compile(r"^(?P<module>[^:]+):(?P<function>[A-Za-z_]\w*)$")
"""``module:function`` or ``path/to/file.py:function``."""
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def load_object(spec: str, option: str, *, error: type[ConfigError] = ConfigError) -> Any:
    """The object ``spec`` names.

    ``"package.module:name"`` imports the module; ``"path/to/file.py:name"`` loads that
    file. Raises ``error`` (a :class:`~turnrl.errors.ConfigError`) naming ``option``
    when ``spec`` is malformed, the import fails or the attribute is missing.
    """
    match = ENTRYPOINT_FORMAT.match(spec.strip())
    if match is None:
        raise error(
            f"{option}: expected 'package.module:function' or 'path/to/file.py:function', "
            f"got {spec!r}"
        )
    target, name = match.group("module"), match.group("function")
    if target.endswith(".py"):
        module = _load_file(target, option, error)
    elif _MODULE.match(target):
        module = _import_module(target, option, error)
    else:
        raise error(f"{option}: {target!r} is neither a module name nor a .py file")
    value = getattr(module, name, None)
    if value is None:
        raise error(f"{option}: {target} has no attribute {name!r}")
    return value


def _import_module(name: str, option: str, error: type[ConfigError]) -> Any:
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise error(f"{option}: cannot import {name!r}: {type(exc).__name__}: {exc}") from exc
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def _load_file(path: str, option: str, error: type[ConfigError]) -> Any:
    file = Path(path)
    if not file.is_file():
        raise error(f"{option}: no such file {path!r}")
    module_name = f"turnrl_agent_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise error(f"{option}: cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise error(f"{option}: {path} failed to import: {type(exc).__name__}: {exc}") from exc
    return module
