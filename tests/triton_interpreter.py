"""Triton's interpreter, with each @triton.jit helper's module patched once.

Under TRITON_INTERPRET=1 a kernel's launch patches triton.language's builtins to the
interpreter's for the launch, and each call of a @triton.jit helper patches those of
the helper's modules again (inspect.getmembers over four modules: ~0.25 ms a call),
even where the launch already did. The kernels here call helpers inside their loops:
that was a quarter of the kernel tests' time. A launch leaves to the helpers only the
modules its kernel does not name (triton's own helpers, such as tl.zeros, read
triton.language.core), and those stay patched once patched: so a helper's module is
patched at its first call only, and each call then runs the helper's rewritten
function as the interpreter's own call does.
"""

from __future__ import annotations

from typing import Any

from triton.runtime import interpreter

_PATCHED_MODULES: set[int] = set()  # id() of each helper's module globals


def _call_helper(self: interpreter.InterpretedFunction, *args: Any, **kwargs: Any) -> Any:
    if id(self.fn.__globals__) not in _PATCHED_MODULES:
        interpreter._patch_lang(self.fn)
        _PATCHED_MODULES.add(id(self.fn.__globals__))
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as error:
        raise interpreter.InterpreterError(repr(error)) from error


def patch_helper_modules_once() -> None:
    """Has the interpreter patch a helper's module once, not at each call."""
    interpreter.InterpretedFunction.__call__ = _call_helper
