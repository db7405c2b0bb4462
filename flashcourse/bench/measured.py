"""Measurements shipped with the course that are no benchmark suite's: their JSON, as dicts.

A suite's results (:func:`flashcourse.bench.shipped`) are records of timed cases; these are other
things measured on the course's H100 that a lecture or an exercise reads, each written by a script in
``lab/`` that says what is in it, and kept in ``results/GPU/measured/``:

* ``ncu_dram``: DRAM bytes read and written by each course kernel under Nsight Compute, beside
  the counted bytes (:mod:`flashcourse.bench.ncu`);
* ``decode_host``: the host's and the GPU's time per decode call, the course's kernels against
  SDPA, with and without CUDA graphs (``lab/gpu_decode_host.py``);
* ``gemm_block_n`` and ``decode_splits``: ``flat_gemm``'s time for every B_N candidate and
  ``flash_decode``'s for every split count, beside what chapter 6's rule and chapter 4's heuristic pick
  (``lab/gpu_sweeps.py``: the measure halves of those chapters' predict -> count -> measure);
* ``primer``: what the Triton primer says a GPU does that the interpreter does not (``tl.dot``'s
  smallest tiles, TF32, ``tl.device_print``'s lines, a compile's cost) and an RMSNorm kernel's time
  (``lab/gpu_primer.py``);
* ``backward_gpt_train`` and ``backward_gpt_train_bfloat16``: chapter 7's GPT trained on the course's
  attention and on SDPA's (``lab/gpu_backward_gpt.py --yardstick``);
* ``fa3``: chapter 10's FlashAttention-3 steps beside cuDNN and ``fa2_forward`` (TFLOP/s, fp16/bf16, d 64/128,
  causal or not, N 1k-16k) and each step's correctness checks, copied from ``lab/gpu_fa3.py``'s run
  (``lab/results/h100/fa3.json``; ``provenance.copied_from`` says what was kept); ``fa3_timeline``, its
  in-kernel timeline (``lab/gpu_fa3.py --timeline``, trimmed from ``lab/results/h100/fa3_timeline.json``);

On two GPUs, ``results/h100x2/measured/`` (``measured(name, gpu="h100x2")``): ``ring``, ``ring_noncausal`` and
``ring_512k``, chapter 11's ring attention beside PyTorch's context parallelism and one GPU
(``torchrun --nproc-per-node 2 -m flashcourse.bench.ring``; the lab keeps the same files in ``lab/results/h100x2/``).
On 2 H200s, ``results/h200x2/measured/``: ``ring_gpt``, chapter 7's GPT trained with its sequence sharded over the 2
GPUs beside one GPU's runs (``torchrun --nproc-per-node 2 lab/gpu_ring_gpt.py``), and ``ring2_bf16_32k_256k``,
``ring2_bf16_512k``, the ring benchmark in bf16 (``lab/run_ring_scaling.sh d``). On 4 H100s of one host,
``results/h100x4/measured/``: ``ring4_64k_256k``, ``ring4_512k``, ``ring4_1m_causal`` (4 GPUs) and ``ring2_64k_256k``,
``ring2_512k`` (2 of them), written by ``lab/run_ring_scaling.sh``.

What the lab measured and the course does not read at run time stays in ``lab/results/``, out of the wheel.

Example:
    >>> ncu = measured("ncu_dram")
    >>> ncu["gpu"], ncu["cases"]["fa2"]["summary"]["counted_read"] > 0
    ('NVIDIA H100 80GB HBM3', True)
"""
from __future__ import annotations

import json

from .harness import RESULTS

__all__ = ["measured", "MEASURED_DIR"]

#: The folder, beside a GPU's suite results, that holds its other measurements.
MEASURED_DIR = "measured"


def measured(name: str, gpu: str = "h100") -> dict:
    """The shipped measurement ``name`` on ``gpu`` (no GPU needed).

    Example:
        >>> measured("decode_host")["provenance"]["gpu"]
        'NVIDIA H100 80GB HBM3'
        >>> measured("nothing")                  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        FileNotFoundError: measured: nothing named 'nothing' shipped for 'h100'; shipped: [...]
    """
    path = RESULTS / gpu / MEASURED_DIR / f"{name}.json"
    if not path.is_file():
        have = sorted(p.stem for p in path.parent.glob("*.json"))
        raise FileNotFoundError(f"measured: nothing named {name!r} shipped for {gpu!r}; shipped: {have or 'none'}")
    return json.loads(path.read_text())
