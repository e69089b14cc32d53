"""Chainer's iterator protocol (``next()``, ``finalize()``, ``serialize``,
the with-block): ``Iterator``, the base of every chainiter iterator, which
becomes a subclass of Chainer's own when Chainer is loaded
(``chainiter._chainer_compat``)."""

from typing import Any, TypeVar

_Self = TypeVar('_Self', bound='Iterator')


class _Root:
    """The base of ``Iterator``: an empty class that Chainer's own Iterator
    replaces when Chainer is loaded (see ``chainiter._chainer_compat``;
    Python lets a class's base be swapped for a plain class, not for
    ``object``)."""


class Iterator(_Root):
    """Chainer's iterator protocol: ``next()``, ``finalize()``,
    ``serialize``."""

    def __iter__(self: _Self) -> _Self:
        return self

    def __next__(self) -> Any:
        raise NotImplementedError

    def next(self) -> Any:
        return self.__next__()

    def finalize(self) -> None:
        """Release the resources of the iterator.  Idempotent."""

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any,
                 traceback: Any) -> None:
        self.finalize()

    def serialize(self, serializer: Any) -> None:
        """Save or load the iterator's state (Chainer's protocol)."""
