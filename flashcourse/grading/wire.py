"""What crosses between the grading process and the process that runs a student's code: plain data only.

The grader calls a student's function in another process (:mod:`.worker`) and must read back what it
returned without trusting it. ``pickle`` would run code while loading, so values travel as JSON in
which arrays are tagged: :func:`encode` accepts NumPy arrays of numbers or booleans, NumPy scalars,
Python ``int``/``float``/``bool``/``str``/``None`` (``nan`` and ``inf`` included), and tuples, lists
and dicts with string keys of those; :func:`decode` builds nothing else. A caller may add tags of its
own both ways (``encode(..., extra=)``, ``decode(..., tags=)``): the worker's chapter 8 masks travel so.
Anything the student returns that is not plain data (a generator, an object) becomes an :class:`Opaque`
value that names its type, so the check says what came back; a torch tensor travels as its values.

This module imports NumPy and the standard library only: the worker, which has no course to import,
runs a copy of it.

Example:
    >>> import numpy as np
    >>> decode(encode((np.arange(3.0), np.float32(0.5), -float("inf"), {"n": None})))
    (array([0., 1., 2.]), np.float32(0.5), -inf, {'n': None})
    >>> decode(encode([np.float64(-np.inf), True, 2 ** 70]))
    [np.float64(-inf), True, 1180591620717411303424]
"""
import base64
import json
import math

import numpy as np

__all__ = ["Opaque", "encode", "decode", "WireError", "MAX_BYTES"]

#: The largest message either side accepts (the checks' arrays are a few MB at most).
MAX_BYTES = 256 * 2 ** 20
_KINDS = "biuf"                       # numpy dtype kinds that may travel: bool, int, uint, float


class WireError(ValueError):
    """A message that is not plain data, or too large."""


class Opaque:
    """What a value that could not travel became: it keeps the name of its type, for the message.

    Example:
        >>> Opaque("generator")
        <a generator object>
    """

    def __init__(self, type_name: str):
        self.type_name = str(type_name)[:80]

    def __repr__(self) -> str:
        return f"<a {self.type_name} object>"


def _array(a: np.ndarray) -> dict:
    a = a if a.flags.c_contiguous else a.copy(order="C")   # (ascontiguousarray would make a 0-d array 1-d)
    return {"$": "nd", "dtype": a.dtype.str, "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}


def _float(x: float):
    x = float(x)
    return x if math.isfinite(x) else {"$": "f", "v": repr(x)}


def _plain(v, depth: int = 0, extra=None):
    if depth > 32:
        raise WireError("nested too deeply")
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, np.generic):           # before float: np.float64 is a float, and keeps its dtype here
        if v.dtype.kind not in _KINDS:
            return {"$": "opaque", "type": f"numpy {type(v).__name__}"}
        return {"$": "scalar", "array": _array(np.asarray(v))}
    if isinstance(v, int):
        return int(v) if abs(v) < 2 ** 63 else {"$": "big", "v": str(int(v))}
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in _KINDS:
            return {"$": "opaque", "type": f"numpy array of dtype {v.dtype}"}
        return _array(v)
    if isinstance(v, tuple):
        return {"$": "tuple", "items": [_plain(x, depth + 1, extra) for x in v]}
    if isinstance(v, list):
        return [_plain(x, depth + 1, extra) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"$": "dict", "items": {k: _plain(x, depth + 1, extra) for k, x in v.items()}}
    if type(v).__module__ == "torch" and type(v).__name__ == "Tensor":   # a tensor: its values, on the CPU
        return _plain(v.detach().cpu().numpy(), depth)
    tagged = extra(v) if extra is not None else None
    if tagged is not None:
        return {"$": str(tagged[0]), "v": _plain(tagged[1], depth + 1)}
    return {"$": "opaque", "type": type(v).__name__}


def encode(value, extra=None) -> bytes:
    """``value`` as one JSON message (bytes); a value that is not plain data travels as :class:`Opaque`, unless
    ``extra(value)`` gives a (tag, plain data) pair for it (``decode``'s ``tags`` build it again).

    Example:
        >>> encode((1, 2.5))
        b'{"$": "tuple", "items": [1, 2.5]}'
        >>> decode(encode([1j], extra=lambda v: ("complex", [v.real, v.imag])), tags={"complex": lambda v: complex(*v)})
        [1j]
    """
    return json.dumps(_plain(value, 0, extra), allow_nan=False).encode()


def _from_array(d: dict) -> np.ndarray:
    dtype = np.dtype(str(d["dtype"]))
    if dtype.kind not in _KINDS:
        raise WireError(f"an array of dtype {dtype}")
    shape = tuple(int(n) for n in d["shape"])
    data = base64.b64decode(d["data"], validate=True)
    if len(data) != dtype.itemsize * math.prod(shape):
        raise WireError("an array whose data does not match its shape")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _built(v, depth: int = 0, tags=None):
    if depth > 34:
        raise WireError("nested too deeply")
    if v is None or isinstance(v, (bool, str, int, float)):
        return v
    if isinstance(v, list):
        return [_built(x, depth + 1, tags) for x in v]
    if not isinstance(v, dict):
        raise WireError(f"a {type(v).__name__}")
    tag = v.get("$")
    if tag == "nd":
        return _from_array(v)
    if tag == "scalar":
        a = _from_array(v["array"])
        if a.shape != ():
            raise WireError("a scalar that is not 0-d")
        return a[()]
    if tag == "f":
        if v["v"] not in ("nan", "inf", "-inf"):
            raise WireError(f"a float {v['v']!r}")
        return float(v["v"])
    if tag == "big":
        return int(str(v["v"]))
    if tag == "tuple":
        return tuple(_built(x, depth + 1, tags) for x in v["items"])
    if tag == "dict":
        return {str(k): _built(x, depth + 1, tags) for k, x in v["items"].items()}
    if tag == "opaque":
        return Opaque(v.get("type", "unknown"))
    if tags and tag in tags:
        try:
            return tags[tag](_built(v["v"], depth + 1))
        except (ValueError, TypeError, KeyError) as e:
            raise WireError(f"a {tag}: {e}") from None
    raise WireError(f"an unknown tag {tag!r}")


def decode(data: bytes, tags=None):
    """The value of one message written by :func:`encode`; :class:`WireError` for anything else (a tag of
    the caller's is built by ``tags[tag](plain data)``).

    Example:
        >>> decode(b'{"$": "f", "v": "nan"}')
        nan
        >>> decode(b'{"$": "nd", "dtype": "|O", "shape": [], "data": ""}')
        Traceback (most recent call last):
        ...
        flashcourse.grading.wire.WireError: an array of dtype object
    """
    if len(data) > MAX_BYTES:
        raise WireError(f"a message of {len(data)} bytes (at most {MAX_BYTES})")
    try:
        return _built(json.loads(data), 0, tags)
    except WireError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise WireError(f"not a message: {type(e).__name__}: {e}") from None
