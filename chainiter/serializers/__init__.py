"""Chainer-compatible serializers for iterator snapshots."""

from chainiter.serializers._base import (  # NOQA
    AbstractSerializer, Deserializer, Serializer)
from chainiter.serializers.npz import (  # NOQA
    DictionarySerializer, NpzDeserializer, load_npz, save_npz)
