#!/usr/bin/env bash
# Chapter 10 on one H100 (issue 34, session 36), under 4 minutes: pingpong_overlap_fastexp and pingpong_overlap_pinned
# beside pingpong_overlap, cuDNN and fa2_forward (gpu_fa3.py's shapes: d 64 and 128, N 1k-16k, causal and not; its
# correctness checks first), then the in-kernel timelines of pingpong_overlap and fastexp (d = 128, N = 8k).
# pinned holds the softmax between the S wait and the PV wait in SASS (lab/fa3.md, "Where ptxas puts the softmax");
# its timeline is left out: the timeline's own clock reads already pin the softmax there in every variant.
# TAG, BUDGET (the timing's seconds) and TL_BUDGET (the timelines') name and size the run (run_fa3_v3.sh: longer).
set -u
O=${OUT:-.}; TAG=${TAG:-v4}; BUDGET=${BUDGET:-155}; TL_BUDGET=${TL_BUDGET:-40}
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout $((BUDGET + 25)) python lab/gpu_fa3.py --variants pingpong_overlap pingpong_overlap_fastexp \
  pingpong_overlap_pinned --budget "$BUDGET" --out "$O/fa3_$TAG.json" > "$O/fa3_$TAG.log" 2>&1
echo "fa3 rc=$?"; tail -40 "$O/fa3_$TAG.log"
timeout $((TL_BUDGET + 15)) python lab/gpu_fa3.py --timeline --variants pingpong_overlap pingpong_overlap_fastexp \
  --budget "$TL_BUDGET" --out "$O/fa3_timeline_$TAG.json" > "$O/fa3_timeline_$TAG.log" 2>&1
echo "timeline rc=$?"; tail -8 "$O/fa3_timeline_$TAG.log"
