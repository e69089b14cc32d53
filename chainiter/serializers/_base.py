"""Chainer's serializer protocol.

An object that can be saved defines ``serialize(serializer)``; for each value
it calls ``value = serializer(key, value)``.  A ``Serializer`` records the
value and returns it unchanged; a ``Deserializer`` returns the stored value
(and raises ``KeyError`` for a missing key when strict).  ``serializer[name]``
gives a child that prefixes keys with ``name/``.
"""

from typing import Any


class AbstractSerializer:

    def __getitem__(self, key: str) -> 'AbstractSerializer':
        raise NotImplementedError

    def __call__(self, key: str, value: Any) -> Any:
        raise NotImplementedError


class Serializer(AbstractSerializer):
    """Base class of serializers that write values."""

    def save(self, obj: Any) -> None:
        """Save ``obj`` into this serializer (``obj.serialize(self)``)."""
        obj.serialize(self)


class Deserializer(AbstractSerializer):
    """Base class of serializers that read values."""

    def load(self, obj: Any) -> None:
        """Load ``obj``'s state from this deserializer
        (``obj.serialize(self)``)."""
        obj.serialize(self)
