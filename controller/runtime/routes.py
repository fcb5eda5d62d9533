"""How a call to the controller actor reaches the object that answers it.

Ray hosts one class, so every call is a method of the facade. Each is made here from
the handler that answers it and the request type that names its parameters
(:mod:`controller.state.requests`): the method takes the request's fields (by position
or by name, as Ray and tests call it, or one request built by a client), builds the
request, which checks them, waits until the controller may act, and hands the request to
the handler. So a call's parameters are written once, in its request type, and its
documentation once, on its handler.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from controller.errors import ReservationError


def route(
    owner: str,
    handler: Callable[..., Any],
    request: type | None = None,
    *,
    ready: bool = True,
) -> Callable[..., Any]:
    """A facade method answering with ``handler``, a method of the facade's attribute
    ``owner``.

    Args:
        owner: the facade attribute holding the object whose method answers.
        handler: that method, taken from its class (``QueueCalls.quotas``).
        request: the call's request type, or None for a call without parameters.
        ready: wait for recovery, and refuse while the table cannot be read, first (the
            facade's ``_ready``); False for the calls that answer regardless.
    """
    name = handler.__name__

    async def method(self, *args: Any, **kw: Any) -> Any:
        target = getattr(getattr(self, owner), name)
        if request is None:
            if args or kw:
                raise ReservationError(f"{name}() takes no arguments")
            if ready:
                await self._ready()
            return await target()
        call = build(request, name, args, kw)
        if ready:
            await self._ready()
        return await target(call)

    functools.update_wrapper(method, handler, assigned=("__name__", "__qualname__", "__doc__"))
    del method.__wrapped__  # Ray unwraps a method to read its signature: keep this one
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if request is not None:
        params += list(inspect.signature(request).parameters.values())
    method.__signature__ = inspect.Signature(params)  # what Ray binds a call against
    return method


def build(request: type, name: str, args: tuple, kw: dict) -> Any:
    """``request`` from a call's arguments, or the one request a client sent."""
    if len(args) == 1 and not kw and isinstance(args[0], request):
        return args[0]  # checked when built (and again when Ray unpickled it)
    try:
        return request(*args, **kw)
    except TypeError as e:
        fields = ", ".join(inspect.signature(request).parameters)
        raise ReservationError(f"{name}(): {e}; it takes {fields}") from None
