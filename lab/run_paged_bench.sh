#!/usr/bin/env bash
# Chapter 9 on one GPU: paged_decode's GPU tests and doctests, then
#   bash lab/run_paged_bench.sh          its batch 1-16 graph replays against flash_decode (lab/gpu_paged.py --graphs
#                                        --small), `flashcourse bench paged` and `flashcourse bench roofline` (the copy
#                                        bandwidth the lecture holds paged_decode's to); about 6 minutes
#   bash lab/run_paged_bench.sh --tail   graph replays of paged_decode with the last, ragged step's loop unpipelined
#                                        beside its default and flash_decode (lab/paged_ab.py --tail); about 2 minutes
set -u
O=${OUT:-.}
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
export PYTHONPATH=$PWD
timeout 200 python -m pytest -q -o addopts= -p no:cacheprovider tests/test_kernels_paged.py flashcourse/kernels/paged.py \
  --doctest-modules > "$O/tests.log" 2>&1; echo "tests rc=$?"; tail -3 "$O/tests.log"
if [ "${1:-}" = "--tail" ]; then
  timeout 300 python lab/paged_ab.py "$O/paged_tail.json" --tail 2>&1 | cut -c1-200
  exit
fi
timeout 150 python lab/gpu_paged.py "$O/paged_small.json" --graphs --small > "$O/paged_small.log" 2>&1; echo "small rc=$?"
cut -c1-220 "$O/paged_small.log" | tail -18
timeout 240 python -m flashcourse.cli bench paged --out "$O/paged.json" > "$O/bench.log" 2>&1; echo "bench rc=$?"; tail -40 "$O/bench.log"
timeout 120 python -m flashcourse.cli bench roofline --out "$O/roofline.json" > "$O/roofline.log" 2>&1; echo "roofline rc=$?"
tail -12 "$O/roofline.log"
