"""Run torchft's lighthouse without importing torch (run as a script, by path).

The wheel's ``torchft_lighthouse`` console script imports ``torchft._torchft``, and
with it the ``torchft`` package, whose ``__init__`` imports torch: about 1.5 s of a
2-core machine before the lighthouse binds, on every election of a leader. The
server is ``lighthouse_main`` in the native extension, which needs nothing from
torch, so this script loads the extension file alone and calls it with its own
arguments (the same flags as ``torchft_lighthouse``).

Only the standard library is imported here; where the extension file cannot be
found (another packaging of torchft), the ordinary import is used.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path


def native_lighthouse_main() -> Callable[[], int | None]:
    package = importlib.util.find_spec("torchft")  # finds the package, does not run it
    if package is not None and package.submodule_search_locations:
        for where in package.submodule_search_locations:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = Path(where) / f"_torchft{suffix}"
                if path.is_file():
                    spec = importlib.util.spec_from_file_location("torchft._torchft", path)
                    if spec is not None and spec.loader is not None:
                        module = importlib.util.module_from_spec(spec)
                        spec.loader.exec_module(module)
                        main: Callable[[], int | None] = module.lighthouse_main
                        return main
    from torchft._torchft import lighthouse_main  # imports torch: slower, same server

    return lighthouse_main  # type: ignore[no-any-return]


if __name__ == "__main__":
    sys.argv[0] = "torchft_lighthouse"
    sys.exit(native_lighthouse_main()())
