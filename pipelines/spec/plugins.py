"""Your own extensions, imported by name from a spec's ``plugins`` list.

A plugin is a module (``my_project.losses``) or a Python file (``extensions/toy.py``,
relative to the working directory) that registers policy losses, advantage estimators
or reward terms when imported. A spec lists the plugins it needs, so ``asyncrlhf run``
(and every Ray actor of the run) imports them before the spec is validated.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["import_plugins"]


def import_plugins(plugins: list[str] | tuple[str, ...]) -> list[ModuleType]:
    """Import each plugin once; a ValueError names the one that cannot be imported."""
    if not isinstance(plugins, list | tuple) or not all(isinstance(p, str) for p in plugins):
        raise ValueError(f"plugins must be a list of module names or .py files, got {plugins!r}")
    return [_import(plugin) for plugin in plugins]


def _import(plugin: str) -> ModuleType:
    try:
        if not plugin.endswith(".py"):
            return importlib.import_module(plugin)
        path = Path(plugin).resolve()
        for module in list(sys.modules.values()):  # already imported (by its dotted name, or as a plugin)
            if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
                return module
        name = f"asyncrlhf_plugin_{path.stem}_{abs(hash(str(path))) & 0xFFFFFF:06x}"
        if not path.is_file():
            raise FileNotFoundError(f"no such file {str(path)!r}")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    except Exception as err:  # the plugin's own error, named
        raise ValueError(f"plugin {plugin!r} cannot be imported: {type(err).__name__}: {err}") from err
