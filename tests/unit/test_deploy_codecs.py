"""The model server's codecs: the inference toolkit's content types, without pickle."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from shoal.deploy.modelserver import codecs


def test_json_csv_and_npy_decode_to_arrays():
    assert codecs.decode('[[1, 2], [3, 4]]', "application/json").tolist() == [[1, 2], [3, 4]]
    assert codecs.decode(b"1,2\n3,4\n", "text/csv; charset=utf-8").tolist() == [[1, 2], [3, 4]]
    stream = io.BytesIO()
    np.save(stream, np.arange(6, dtype=np.int16).reshape(2, 3))
    array = codecs.decode(stream.getvalue(), "application/x-npy")
    assert array.dtype == np.int16 and array.shape == (2, 3)


def test_an_npy_body_with_pickled_objects_is_refused():
    stream = io.BytesIO()
    np.save(stream, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="pickle"):
        codecs.decode(stream.getvalue(), "application/x-npy")


def test_encoders_give_the_accepted_type():
    value = np.array([[1.5, 2.0]])
    assert json.loads(codecs.encode(value, "application/json")) == [[1.5, 2.0]]
    assert codecs.encode(value, "text/csv") == "1.5,2.0\n"
    back = np.load(io.BytesIO(codecs.encode([[1.0, 2.0]], "application/x-npy")))
    assert back.dtype == np.float64 and back.tolist() == [[1.0, 2.0]]  # a list: float64


def test_an_unknown_type_names_itself_and_the_fix():
    with pytest.raises(codecs.UnsupportedFormatError, match="image/png.*input_fn"):
        codecs.decode(b"...", "image/png")
    with pytest.raises(codecs.UnsupportedFormatError, match="image/png"):
        codecs.encode([1], "image/png")
    assert codecs.encodable("text/csv") and not codecs.encodable("image/png")
