"""Request serializers and response deserializers, as SDK v2's ``sagemaker.serializers`` and
``sagemaker.deserializers``: a serializer has ``CONTENT_TYPE`` and ``serialize(data)``, a
deserializer ``ACCEPT`` (a tuple) and ``deserialize(stream, content_type)``. Content types are
compared exactly, as v2 does (``text/csv; charset=utf-8`` is not ``text/csv``)."""

from __future__ import annotations

import io
import json

import numpy as np


class IdentitySerializer:
    def __init__(self, content_type: str = "application/octet-stream"):
        self.CONTENT_TYPE = content_type

    def serialize(self, data):
        return data


class JSONSerializer:
    CONTENT_TYPE = "application/json"

    def serialize(self, data) -> str:
        if hasattr(data, "read"):
            return data.read()
        return json.dumps(data.tolist() if isinstance(data, np.ndarray) else data)


class CSVSerializer:
    CONTENT_TYPE = "text/csv"

    def serialize(self, data) -> str:
        if hasattr(data, "read"):
            return data.read()
        rows = np.atleast_2d(np.asarray(data))
        return "\n".join(",".join(str(v) for v in row) for row in rows)


class NumpySerializer:
    """``np.save`` of the array (its dtype kept; lists through ``np.array(data, dtype)``)."""

    def __init__(self, dtype=None, content_type: str = "application/x-npy"):
        self.dtype, self.CONTENT_TYPE = dtype, content_type

    def serialize(self, data) -> bytes:
        if hasattr(data, "read"):
            return data.read()
        array = data if isinstance(data, np.ndarray) else np.array(data, self.dtype)
        if array.size == 0:
            raise ValueError("Cannot serialize empty array.")
        stream = io.BytesIO()
        np.save(stream, array)
        return stream.getvalue()


class BytesDeserializer:
    ACCEPT = ("*/*",)

    def deserialize(self, stream, content_type: str) -> bytes:
        try:
            return stream.read()
        finally:
            stream.close()


class StringDeserializer:
    ACCEPT = ("application/json",)

    def __init__(self, encoding: str = "UTF-8", accept: str = "application/json"):
        self.encoding, self.ACCEPT = encoding, (accept,)

    def deserialize(self, stream, content_type: str) -> str:
        try:
            return stream.read().decode(self.encoding)
        finally:
            stream.close()


class JSONDeserializer:
    ACCEPT = ("application/json",)

    def deserialize(self, stream, content_type: str):
        try:
            return json.load(io.TextIOWrapper(io.BytesIO(stream.read()), encoding="utf-8"))
        finally:
            stream.close()


class NumpyDeserializer:
    """An array from csv, json, npy or npz (exact content types), else ``ValueError``."""

    def __init__(self, dtype=None, accept: str = "application/x-npy", allow_pickle: bool = False):
        self.dtype, self.ACCEPT, self.allow_pickle = dtype, (accept,), allow_pickle

    def deserialize(self, stream, content_type: str):
        try:
            body = stream.read()
        finally:
            stream.close()
        if content_type == "text/csv":
            return np.genfromtxt(io.StringIO(body.decode("utf-8")), delimiter=",",
                                 dtype=self.dtype)
        if content_type == "application/json":
            return np.array(json.loads(body), dtype=self.dtype)
        if content_type == "application/x-npy":
            return np.load(io.BytesIO(body), allow_pickle=self.allow_pickle)
        if content_type == "application/x-npz":
            return np.load(io.BytesIO(body), allow_pickle=self.allow_pickle)
        raise ValueError(f"{type(self).__name__} cannot read content type {content_type}.")
