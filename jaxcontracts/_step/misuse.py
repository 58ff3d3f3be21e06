"""What ``@jc.hot_step`` was given that is not a step function, refused at decoration.

A class (a state class, say), an option passed by position, a generator, a
coroutine or a classmethod, and a ``signature=`` that is an instance: each a
``DefinitionError`` with the form that works.
"""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Any

from .._errors import DefinitionError
from .._format import qualname
from .._state.fields import is_state

__all__ = ["refuse_non_step"]


def refuse_non_step(fn: Any, signature: Any) -> None:
    """What is not a step function (a class, an option given by position, a
    generator, a coroutine, a classmethod), and a ``signature=`` that is not a
    type: refused at decoration, with the form that works."""
    if isinstance(fn, classmethod):
        inner = qualname(fn.__func__)
        raise DefinitionError(
            f"@jc.hot_step on the classmethod {inner}: a step closes over what it does "
            "not take as arguments, and a class is no array.",
            fix="make it a @staticmethod (under @jc.hot_step) or a function taking the "
            "state, or a method (self is closed over per instance).",
        )
    if isinstance(fn, type):
        what = "the state class" if is_state(fn) else "the class"
        raise DefinitionError(
            f"@jc.hot_step decorates the step function, not {what} {fn.__qualname__}.",
            fix="decorate the function that takes the state and returns the new one: "
            f"@jc.hot_step def advance(s: {fn.__name__}) -> {fn.__name__}: ...",
        )
    if not callable(fn):
        shown = repr(fn) if isinstance(fn, (str, int, float, bool, tuple)) else type(fn).__name__
        raise DefinitionError(
            f"@jc.hot_step got {shown} where the step function goes: its options are "
            "keywords.",
            fix=f"@jc.hot_step(donate={fn!r})"
            if isinstance(fn, str)
            else "@jc.hot_step(signature=State, donate=\"all\")",
        )
    target = fn.func if isinstance(fn, functools.partial) else fn
    kind = (
        "an async generator function" if inspect.isasyncgenfunction(target)
        else "a generator function" if inspect.isgeneratorfunction(target)
        else "an async function" if inspect.iscoroutinefunction(target)
        else None
    )
    if kind is not None:
        raise DefinitionError(
            f"@jc.hot_step on {qualname(target)}, {kind}: a step is compiled to one "
            "executable that returns arrays, and a "
            f"{'generator' if 'generator' in kind else 'coroutine'} returns none until "
            "it is resumed.",
            fix="make the step a plain function that returns the new state, and loop, "
            "yield or await around its calls in your own code.",
        )
    if signature is not None and not (
        isinstance(signature, (type, str)) or typing.get_origin(signature) is not None
    ):
        cls = type(signature).__name__
        raise DefinitionError(
            f"@jc.hot_step: signature= takes the state's type, and got a {cls} instance.",
            fix=f"signature={cls}",
        )
