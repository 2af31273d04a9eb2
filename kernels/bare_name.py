"""This folder, found under the bare name ``kernels``, hands that name to its owner.

The folder is the package ``hetero_infer.kernels``. Where a checkout's root is on
sys.path (``python -m`` from the checkout, the test processes), Python also finds it as
``kernels``, the name of Hugging Face's kernels package, which transformers imports
(5.25 on: ``from kernels import ...`` at import). Imported under that name, the folder
loads the installed package of that name in its place, from the rest of sys.path.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

BARE_NAME = "kernels"


def load_installed_package(found: str) -> None:
    """Puts the ``kernels`` package found outside the folder that holds ``found`` (the
    kernels folder imported under the bare name), where there is one, in ``sys.modules``."""
    checkout = os.path.dirname(os.path.abspath(found))
    elsewhere = [p for p in sys.path if os.path.abspath(p or os.curdir) != checkout]
    spec = importlib.machinery.PathFinder.find_spec(BARE_NAME, elsewhere)
    if spec is None or spec.loader is None:
        # None installed: the folder stays, which transformers (asking whether the
        # package is installed, before 5.25 by importing it) reads as no version, none.
        return
    module = importlib.util.module_from_spec(spec)
    # the import statement that found this folder returns what sys.modules then holds
    # (and drops it, should the package fail to load)
    sys.modules[BARE_NAME] = module
    spec.loader.exec_module(module)
