"""numpy imported on first use.

Every command's options are built from the registries (scores, scalings, similarities, ...)
when the CLI starts, and those modules compute with numpy. ``attncli --help``, shell
completion and a mistyped option need the registries but never an array, so the modules
that the options read take numpy from here: a module that loads when one of its attributes
is first used (``importlib.util.LazyLoader``), saving the ~70 ms numpy's import costs.

    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        import numpy as np
    else:
        from attncli.lazy import numpy as np
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name`` as a module object that is imported when first used; the module itself if it is
    already imported. Registered in sys.modules, so a later ``import name`` anywhere (torch's
    import of numpy, say) gets the same module and a C extension is never loaded twice."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:  # not installed: the plain import raises the usual error
        return importlib.import_module(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


numpy = lazy_module("numpy")
