"""Wire compression for reductions: ``Compression.none`` and ``Compression.fp16``.

A compressor turns a tensor into what travels (``compress`` returns the tensor and a
context) and turns the reduced result back (``decompress``). ``fp16`` casts floating
tensors to float16 for the wire and back to their own dtype after; other dtypes travel
unchanged.
"""

from __future__ import annotations

import tensorflow as tf
from shoal.errors import ValidationError


class NoneCompression:
    """Tensors travel as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compression:
    """Floating tensors travel as float16 (half the bytes); the result keeps the input dtype."""

    @staticmethod
    def compress(tensor):
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            return tf.cast(tensor, tf.float16), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """The available compressors (``none``, ``fp16``)."""

    none = NoneCompression
    fp16 = FP16Compression


def parse_compression(compression):
    """``None`` means no compression; anything else needs ``compress``/``decompress``."""
    if compression is None:
        return NoneCompression
    if not (callable(getattr(compression, "compress", None))
            and callable(getattr(compression, "decompress", None))):
        raise ValidationError(
            f"'compression' must be Compression.none or Compression.fp16 (got {compression!r})"
        )
    return compression
