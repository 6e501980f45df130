"""Serializers and deserializers as SDK v2's: content types compared exactly."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from shoal.deploy import serializers as s


def stream(data: bytes):
    return io.BytesIO(data)


def test_numpy_round_trip_keeps_the_dtype_and_refuses_empty_input():
    array = np.arange(4, dtype=np.float32).reshape(2, 2)
    body = s.NumpySerializer().serialize(array)
    back = s.NumpyDeserializer().deserialize(stream(body), "application/x-npy")
    assert back.dtype == np.float32 and back.tolist() == array.tolist()
    assert np.load(io.BytesIO(s.NumpySerializer(dtype="int8").serialize([1, 2]))).dtype == np.int8
    with pytest.raises(ValueError, match="empty"):
        s.NumpySerializer().serialize([])


def test_the_numpy_deserializer_reads_json_and_csv_but_only_exact_types():
    d = s.NumpyDeserializer()
    assert d.deserialize(stream(b"[[1, 2]]"), "application/json").tolist() == [[1, 2]]
    assert d.deserialize(stream(b"1,2\n3,4"), "text/csv").tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="cannot read content type text/csv; charset=utf-8"):
        d.deserialize(stream(b"1,2"), "text/csv; charset=utf-8")
    assert d.ACCEPT == ("application/x-npy",)


def test_json_csv_identity_and_bytes():
    assert json.loads(s.JSONSerializer().serialize(np.array([[1.0, 2.0]]))) == [[1.0, 2.0]]
    assert s.JSONSerializer().serialize({"instances": [1]}) == '{"instances": [1]}'
    assert s.CSVSerializer().serialize([[1, 2], [3, 4]]) == "1,2\n3,4"
    assert s.IdentitySerializer("image/png").CONTENT_TYPE == "image/png"
    assert s.JSONDeserializer().deserialize(stream(b'{"a": 1}'), "application/json") == {"a": 1}
    assert s.BytesDeserializer().deserialize(stream(b"\x00\x01"), "x") == b"\x00\x01"
    assert s.StringDeserializer().deserialize(stream("é".encode()), "x") == "é"
