"""Data shipped with the course.

* ``minilm_scores.json``: MiniLM-L6's attention-score statistics (chapter 5, :mod:`flashcourse.reference.decode_scores`);
* ``linear_thresholds.json``: the (M, N, K) thresholds with which ``flashcourse.kernels.linear``
  picks gemv, flat GEMM or torch.matmul, measured on an H100 by ``tools/gpu_gemm.py --thresholds``
  (chapter 6).
"""
