"""Run torchft's lighthouse without importing torch (run as a script, by path).

The wheel's ``torchft_lighthouse`` console script imports ``torchft._torchft``, and
with it the ``torchft`` package, whose ``__init__`` imports torch: about 1.5 s of a
2-core machine before the lighthouse binds, on every election of a leader. The
server is ``lighthouse_main`` in the native extension, which needs nothing from
torch, so this script loads the extension file alone and calls it with its own
arguments (the same flags as ``torchft_lighthouse``).

Only the standard library is used here, as everywhere in the daemon. The daemon
starts this script only where :func:`native_extension` finds the file; otherwise it
runs the ``torchft_lighthouse`` script (daemon/leadership/lighthouse.py).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path


def native_extension() -> Path | None:
    """The file of ``torchft._torchft``, found without running the ``torchft`` package."""
    package = importlib.util.find_spec("torchft")
    if package is None or not package.submodule_search_locations:
        return None
    for where in package.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(where) / f"_torchft{suffix}"
            if path.is_file():
                return path
    return None


def native_lighthouse_main(path: Path) -> Callable[[], int | None]:
    spec = importlib.util.spec_from_file_location("torchft._torchft", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load torchft's native extension {path}; reinstall torchft.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main: Callable[[], int | None] = module.lighthouse_main
    return main


if __name__ == "__main__":
    found = native_extension()
    if found is None:
        raise SystemExit("torchft's native extension _torchft was not found; reinstall torchft.")
    sys.argv[0] = "torchft_lighthouse"
    sys.exit(native_lighthouse_main(found)())
