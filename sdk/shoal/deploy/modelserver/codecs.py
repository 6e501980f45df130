"""Content types, as the SageMaker inference toolkit decodes and encodes them.

Decoding gives a numpy array: JSON through ``json.loads``, CSV through ``numpy.genfromtxt``,
NPY through ``numpy.load`` and NPZ as a scipy sparse matrix. Unlike the toolkit, NPY bodies
are loaded without pickle: an object array in a request would run the sender's code in the
server. Encoding takes an array (or anything ``numpy.asarray`` takes) to bytes.
"""

from __future__ import annotations

import io
import json

import numpy as np

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
NPZ = "application/x-npz"
OCTET_STREAM = "application/octet-stream"
ANY = "*/*"
# decoded to str before input_fn, as the toolkit does; the rest stay bytes
TEXT_TYPES = (JSON, CSV)


class UnsupportedFormatError(Exception):
    """A content type or accept that no codec handles (answered 500, as the toolkit)."""

    def __init__(self, content_type: str):
        super().__init__(f"content type {content_type!r} is not supported by the default "
                         f"handlers: implement input_fn to decode it (output_fn to encode it)")
        self.content_type = content_type


def media_type(header: str | None) -> str:
    """``text/csv; charset=utf-8`` -> ``text/csv``."""
    return (header or "").split(";")[0].strip().lower()


def decode(body, content_type: str) -> np.ndarray:
    kind = media_type(content_type)
    if kind == JSON:
        return np.array(json.loads(_text(body)))
    if kind == CSV:
        return np.genfromtxt(io.StringIO(_text(body)), delimiter=",")
    if kind == NPY:
        return np.load(io.BytesIO(_bytes(body)), allow_pickle=False)
    if kind == NPZ:
        import scipy.sparse

        return scipy.sparse.load_npz(io.BytesIO(_bytes(body)))
    raise UnsupportedFormatError(content_type)


def encode(value, accept: str) -> bytes | str:
    kind = media_type(accept)
    if kind == JSON:
        return json.dumps(value.tolist() if hasattr(value, "tolist") else value)
    if kind == CSV:
        stream = io.StringIO()
        np.savetxt(stream, np.asarray(value), delimiter=",", fmt="%s")
        return stream.getvalue()
    if kind == NPY:
        stream = io.BytesIO()
        np.save(stream, np.asarray(value))
        return stream.getvalue()
    raise UnsupportedFormatError(accept)


def encodable(accept: str) -> bool:
    return media_type(accept) in (JSON, CSV, NPY)


def _text(body) -> str:
    return body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body


def _bytes(body) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)
