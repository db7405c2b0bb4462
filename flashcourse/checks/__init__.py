"""The exercise checks: one call under each exercise, one line when it is right, a precise error otherwise.

A check cell of an exercise notebook is a one-liner, tagged ``nbval-check-output`` (so that
``pytest --nbval-lax`` compares its output)::

    check.online_softmax(online_step)

Each check runs your function on *shown* cases (fixed; a failure prints their input) and on
*hidden* cases drawn afresh on every run (ragged sizes, large logits, -inf entries, rows that see
no key), compares with a float64 reference, and prints one line that is the same on every run, e.g.
``online_softmax: 40 cases passed (8 shown, 32 hidden) ✓``. That line is the cell's expected
output under nbval, so the cell passes only when every case does.

On failure it raises an AssertionError that names the case (its kind, its shape, and for a hidden
case the seed that draws it again: ``check.online_softmax(online_step, seed=...)``), the first
wrong element (index, expected, got) or the wrong shape/dtype, and a hint. A function that still
raises NotImplementedError (or a Triton kernel whose body is still ``pass``, so that it writes
nothing) is reported as not implemented yet.

The checks, by chapter:

* :mod:`.primer` (chapter 0b, the Triton primer): :func:`rms_norm_kernel` (a first Triton kernel: RMSNorm,
  one program per row, the row in one masked block) and :func:`rms_norm_looped_kernel` (the same, looping
  over the blocks of a long row); :mod:`.primer_puzzles`: :func:`axpy_kernel`, :func:`outer_kernel`,
  :func:`pad_scores_kernel` (blocks and masks, a 2-D grid, ``tl.where``); :mod:`.primer_tiles`:
  :func:`logsumexp_kernel` (a reduction along an axis, ``exp2``) and :func:`dot_tile_kernel` (``tl.dot``);
  :mod:`.primer_predict`: :func:`predict_rms_norm` (RMSNorm's bytes and its H100 time, predicted);
  :mod:`.primer_waves`: :func:`grid_waves` (the programs an SM holds under its limits, and a grid's waves);
* :mod:`.online` (chapter 1): :func:`online_softmax` (the online normaliser's step, driven one element
  at a time), :func:`merge`, :func:`softmax_kernel`; :mod:`.online_predict`: :func:`softmax_bytes` (the
  bytes each softmax moves through HBM, predicted and counted); :mod:`.online_entropy`:
  :func:`online_cross_entropy` (the cross-entropy of rows read once, in blocks);
* :mod:`.attention` (chapters 2 and 3): :func:`fa1_step` (FlashAttention-1's inner step, run
  inside FA1's loops), :func:`fa2_attention` (FlashAttention-2's deferred rescale, in NumPy) and
  :func:`fa2_kernel` (the inner loop of the FA2 Triton kernel); :mod:`.attention_predict`:
  :func:`fa1_accesses` (FA1's HBM traffic, predicted and counted); :mod:`.attention_writes`: :func:`o_writes`
  (O's writes to HBM in each loop order, counted); :mod:`.attention_causal`: :func:`skipped_blocks` (the K/V
  blocks the causal kernel never loads); :mod:`.attention_tiles`:
  :func:`choose_fa2_config` (the FA2 kernel's tiles, warps and stages for a GPU, from a count of what
  one program asks of an SM);
* :mod:`.decode` (chapter 4): :func:`lse_combine` (Flash-Decoding's log-sum-exp combine, in
  NumPy) and :func:`split_kv_kernel` (the per-chunk loop of the split-KV Triton kernel);
  :mod:`.decode_splits`: :func:`choose_num_splits` (how many splits, by the wave model); :mod:`.decode_combine`:
  :func:`combine_crossover` (the split count at which the combine moves as much as a split reads);
  :mod:`.decode_unified`: :func:`unified_max_partials` (FlashDecoding++'s unified-max partials and
  their overflow detection); :mod:`.decode_phi`: :func:`choose_phi` (the unified maximum for a target
  fallback rate);
  :mod:`.decode_partials`: :func:`partials_kernel` (the unified-max partials in Triton, added with
  ``tl.atomic_add``);
* :mod:`.gemm` (chapter 6): :func:`choose_block_n` (FlashDecoding++'s choice of B_N from the
  compute/memory ratio and the SM count, in Python) and :func:`flat_gemm_kernel` (the K loop of the
  flat GEMM Triton kernel); :mod:`.gemm_predict`: :func:`gemm_accesses` (the tiled flat GEMM's HBM traffic,
  predicted and counted); :mod:`.gemm_split`: :func:`k_shares` (the shares of K the programs of a column tile
  take when K is split).
* :mod:`.backward` (chapter 7): :func:`fa2_backward_step` (the recomputed backward step, in NumPy, run inside
  the chapter's loops) and :func:`dkdv_kernel` (the inner loop of the dK/dV kernel in Triton);
  :mod:`.backward_lse`: :func:`backward_step_dlse` (the step for a loss that uses the log-sum-exp too);
  :mod:`.backward_predict`: :func:`backward_accesses` (Algorithm 2's HBM traffic, predicted and counted).
* :mod:`.sparse` (chapter 8): :func:`block_lists` (the full and partial key blocks of each query block, from
  a mask function, in NumPy) and :func:`sparse_kernel` (the kernel's loops over those lists, in Triton; the
  mistakes it names are emulated by :mod:`.sparse_mistakes`); :mod:`.sparse_bands`: :func:`band_lists` (the
  lists of a band mask from each query's range of keys); :mod:`.sparse_predict`: :func:`forward_time` (the
  forward's time predicted from the blocks, graded against the H100's and H200's clock).
* :mod:`.paged` (chapter 9): :func:`cache_step` (a paged KV cache's bookkeeping in NumPy: blocks, reference
  counts, copy-on-write, driven one request at a time); :mod:`.paged_walk`: :func:`paged_split_kernel` (the
  page walk of the split-KV kernel, in Triton); :mod:`.paged_predict`: :func:`requests_that_fit` (how many requests a cache of
  a given size holds, reserved contiguously and in pages);
* :mod:`.fa3` (chapter 10): :func:`block_ns` (a FlashAttention-3 step's time per key block, predicted and counted
  with the schedule model) and :func:`ring_phases` (the stage and mbarrier phases of block j in the ring of stages,
  as the Gluon kernel computes them) and :func:`overlap_order` (one step of FA3's overlapped loop, put in an order
  its barriers allow); :mod:`.fa3_turn`: :func:`take_turn` (the ping-pong turn's mbarrier wait, in Gluon: its
  protocol replayed through a model of the barriers on a CPU; :mod:`.fa3_hopper` compiles it into the course's
  kernel for sm_90 and runs that on hidden cases on an H100 or H200).
* :mod:`.ring` (chapter 11): :func:`ring_step` (one step of ring attention over simulated ranks: attend, merge with
  the log-sum-exps, pass the K/V shard on, driven for the whole ring), :func:`zigzag_positions` (the causal
  load-balanced layout) and :func:`ring_predict` (a step's bytes and the shard length past which the transfer hides).

Adding a check for a later chapter: a module ``STEM.py`` here (the chapter's stem, see
:mod:`flashcourse.chapters`) with a function ``NAME(fn, seed=None)`` that refuses a non-function
(``require_callable``, or ``require_kernel`` for a Triton kernel), builds its shown cases (fixed)
and hidden cases (drawn from ``np.random.default_rng(seed_of(seed))``) as :class:`Case` objects,
calls the student's code through ``call``, compares each result with a float64 reference through
``compare`` (tolerances justified in a comment), and ends with ``passed``, which prints the one
line (all of them in :mod:`.cases`); ``NAME`` goes in the module's ``__all__``, which is re-exported
here, and in the chapter's ``checks`` in :data:`flashcourse.chapters.CHAPTERS`. What the tests need
besides (float64 references, case generators) is public in the module but stays out of ``__all__``.

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> def online_step(m, d, x_j):
    ...     m_new = max(m, x_j)
    ...     return m_new, (d * np.exp(m - m_new) + np.exp(x_j - m_new) if m_new > -np.inf else d)
    >>> checks.online_softmax(online_step)
    online_softmax: 40 cases passed (8 shown, 32 hidden) ✓
"""
from .. import chapters
from .cases import Case

__all__ = ["Case"] + chapters.export(__name__, globals())   # one module per chapter: see flashcourse.chapters
