#!/usr/bin/env bash
# Issue 35 on 2 GPUs of one host (session 35): chapter 7's GPT trained with its sequence sharded by ring attention
# beside one GPU (lab/gpu_ring_gpt.py), the ring's NCCL tests, and notebook 10's solutions under nbval (Hopper).
#   bash lab/run_ring_gpt.sh          (carry .whl: nbval's wheels)
set -u
O=${OUT:-.}
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD
timeout 330 python -m torch.distributed.run --standalone --nproc-per-node 2 lab/gpu_ring_gpt.py --out "$O" \
  > "$O/ring_gpt.log" 2>&1; echo "gpt rc=$?"; tail -15 "$O/ring_gpt.log"
timeout 90 python -m pytest -n 0 -q -o addopts="" tests/test_distributed_ring.py 2>&1 | tail -2
timeout 120 python -m pytest -n 0 -q -o addopts="" -p nbval --nbval-lax solutions/10_fa3_hopper.ipynb 2>&1 | tail -25
