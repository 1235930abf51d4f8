"""Run a function on a module once it is imported, by whoever imports it, without importing it first.

A framework plugin patches classes of modules the job may never import (verl's teacher loop pulls in its
rollout server's web stack): importing them at the plugin's start would cost every process of the job
their import time, and fail where their needs are missing. ``when_imported`` patches the module right
after its own code has run, as wrapt's post-import hooks do; or at once when it is already imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.Lock()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name, it asks the other finders, then wraps the loader."""

    def find_spec(self, name, path, target=None):
        if name not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own loader (its resources, its source for tracebacks), not this wrapper
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)  # the module's own errors are the importer's, as without us
        with _lock:
            hooks = _hooks.pop(module.__name__, [])
        for hook in hooks:
            try:
                hook(module)
            except Exception as e:  # ours: never the importer's failure
                print(f"gkd: patching {module.__name__} after its import failed ({type(e).__name__}: {e}); "
                      "the job runs on with it unpatched", file=sys.stderr, flush=True)


_finder = _Finder()


def when_imported(name: str, hook: Callable[[ModuleType], None]) -> None:
    """``hook(module)`` once ``name`` is imported: now if it is, else right after its import."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    hook(module)
