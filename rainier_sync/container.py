"""A small dependency container: what a running job resolves its services from."""

from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar, overload

from .errors import BindingError

__all__ = ["Container"]

T = TypeVar("T")

_INSTANCE, _SINGLETON, _SCOPED = 0, 1, 2


def _describe(key: Any) -> str:
    return getattr(key, "__qualname__", None) or repr(key)


class Container:
    """Bindings from keys (usually classes) to objects.

    - ``instance(key, obj)``: always ``obj``.
    - ``singleton(key, factory)``: ``factory(container)`` once, then the same object.
    - ``scoped(key, factory)``: one object per scope; a scope is one job on one
      worker thread, and :meth:`flush_scoped` (the worker calls it between jobs)
      forgets the current thread's scoped objects.

    A factory takes the container as its one argument, or none.
    """

    def __init__(self) -> None:
        self._bindings: dict[Any, tuple[int, Any]] = {}
        self._singletons: dict[Any, Any] = {}
        self._lock = threading.RLock()
        self._scope = threading.local()

    def instance(self, key: Any, obj: Any) -> Container:
        with self._lock:
            self._bindings[key] = (_INSTANCE, obj)
            self._singletons.pop(key, None)
        return self

    def singleton(self, key: Any, factory: Callable[..., Any]) -> Container:
        with self._lock:
            self._bindings[key] = (_SINGLETON, factory)
            self._singletons.pop(key, None)
        return self

    def scoped(self, key: Any, factory: Callable[..., Any]) -> Container:
        with self._lock:
            self._bindings[key] = (_SCOPED, factory)
        return self

    def bound(self, key: Any) -> bool:
        return key in self._bindings

    __contains__ = bound

    @overload
    def resolve(self, key: type[T]) -> T: ...

    @overload
    def resolve(self, key: Any) -> Any: ...

    def resolve(self, key: Any) -> Any:
        """The object bound to ``key``; :class:`BindingError` naming the key if none is."""
        try:
            kind, target = self._bindings[key]
        except KeyError:
            raise BindingError(f"nothing is bound to {_describe(key)} in the container") from None
        if kind == _INSTANCE:
            return target
        if kind == _SINGLETON:
            try:
                return self._singletons[key]
            except KeyError:
                pass
            with self._lock:
                if key not in self._singletons:
                    self._singletons[key] = self._call(target)
                return self._singletons[key]
        scope: dict[Any, Any] | None = getattr(self._scope, "objects", None)
        if scope is None:
            scope = self._scope.objects = {}
        if key not in scope:
            scope[key] = self._call(target)
        return scope[key]

    def _call(self, factory: Callable[..., Any]) -> Any:
        try:
            return factory(self)
        except TypeError as exc:
            # A zero-argument factory is common; only retry when that was the problem.
            if "positional argument" not in str(exc):
                raise
            return factory()

    def flush_scoped(self) -> None:
        """Forget this thread's scoped objects (closing those that have ``close()``)."""
        scope: dict[Any, Any] | None = getattr(self._scope, "objects", None)
        if not scope:
            return
        self._scope.objects = {}
        for obj in scope.values():
            close = getattr(obj, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - a failing close must not break the worker
                    import logging

                    logging.getLogger("rainier_sync").exception("closing a scoped binding failed")
