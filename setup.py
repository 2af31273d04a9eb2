"""Builds the CPU kernels (kernels/csrc) into the package at install time.

Everything else about the package is in pyproject.toml. The kernels compile against
the torch that is installed, so the build needs it importable: install torch first,
then this package with ``--no-build-isolation`` (the Makefile and the Dockerfile do).
The library is compiled for the installing machine's own CPU (``-march=native``) and
records which torch, which sources and which CPU features it was built for
(kernels/cpu_extension.py loads it only where all three still hold, and otherwise
compiles the kernels on first use as before). Where torch is missing or the compiler
fails, the install still succeeds, with a warning: the engine then falls back the
same way.
"""

from __future__ import annotations

import sys

from setuptools import setup

sys.path.insert(0, "kernels")  # the build recipe, without importing the kernels package
import cpu_build  # noqa: E402

setup(**cpu_build.setup_kwargs())
