#!/usr/bin/env bash
# Chapter 10 on one H100 (prepared in session 35, issue 34): pingpong_overlap_fastexp (the softmax with the scale
# in one FMA a score) beside pingpong_overlap, cuDNN and fa2_forward (all 40 shapes, its 97 correctness checks first),
# then both variants' in-kernel timelines (d = 128, N = 8k).   bash lab/run_fa3_v3.sh    (about 7 minutes)
set -u
O=${OUT:-.}
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 300 python lab/gpu_fa3.py --variants pingpong_overlap pingpong_overlap_fastexp --budget 250 \
  --out "$O/fa3_v3.json" > "$O/fa3_v3.log" 2>&1; echo "fa3 rc=$?"; tail -40 "$O/fa3_v3.log"
timeout 150 python lab/gpu_fa3.py --timeline --variants pingpong_overlap pingpong_overlap_fastexp \
  --budget 110 --out "$O/fa3_timeline_v3.json" > "$O/fa3_timeline_v3.log" 2>&1; echo "timeline rc=$?"; tail -8 "$O/fa3_timeline_v3.log"
