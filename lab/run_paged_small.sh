#!/usr/bin/env bash
# Chapter 9 on one H100 (issue 33): its kernel tests and the grading kernel-start tests on the GPU, paged_decode
# against flash_decode at batch 1-16 in graph replays (lab/gpu_paged.py --small), then the bench suite.
# bash lab/run_paged_small.sh   (carry .whl; about 5 minutes)
set -u
O=${OUT:-.}
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/site:$PWD
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 150 python -m pytest -q -o addopts= -p no:cacheprovider tests/test_kernels_paged.py flashcourse/kernels/paged.py \
  tests/test_grading_kernel_start.py > "$O/tests.log" 2>&1; echo "tests rc=$?"; tail -3 "$O/tests.log"
timeout 150 python lab/gpu_paged.py "$O/paged_small.json" --graphs --small > "$O/paged_small.log" 2>&1; echo "small rc=$?"
cut -c1-220 "$O/paged_small.log" | tail -18
timeout 240 python -m flashcourse.cli bench paged --out "$O/paged.json" > "$O/bench.log" 2>&1; echo "bench rc=$?"; tail -25 "$O/bench.log"
