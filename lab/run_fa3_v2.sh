#!/usr/bin/env bash
# Chapter 10 on one H100 (session 35): exercise 10's take_turn on Hopper, the persistent variant beside
# pingpong_overlap, cuDNN and fa2_forward, each variant's in-kernel timeline, and notebook 10's solutions under nbval.
#   bash lab/run_fa3_v2.sh          (carry .whl: nbval's wheels)
set -u
O=${OUT:-.}
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
timeout 120 python -m pytest -n 0 -q -o addopts="" -rs tests/test_checks_fa3.py -k "hopper or solutions_pass" 2>&1 | tail -4
timeout 300 python lab/gpu_fa3.py --variants pingpong_overlap pingpong_overlap_persistent --budget 250 \
  --out "$O/fa3_v2.json" > "$O/fa3_v2.log" 2>&1; echo "fa3 rc=$?"; tail -40 "$O/fa3_v2.log"
timeout 150 python lab/gpu_fa3.py --timeline --variants pipeline ws pingpong_overlap pingpong_overlap_persistent \
  --budget 110 --out "$O/fa3_timeline.json" > "$O/fa3_timeline.log" 2>&1; echo "timeline rc=$?"; tail -8 "$O/fa3_timeline.log"
timeout 120 python -m pytest -n 0 -q -o addopts="" -p nbval --nbval-lax solutions/10_fa3_hopper.ipynb 2>&1 | tail -3
