#!/usr/bin/env bash
# Issue 33, batch 1 at short lengths (lab/paged.md), on one GPU, about 3 minutes: graph replays of flash_decode,
# paged_decode and paged_decode with its pages in order (lab/ncu_paged_small.py), then Nsight Compute's full set for
# one call of each kernel (paged_decode also with 64-key steps, 3 stages) at 1 x 1k and 1 x 8k, pages of 16 (CSV under $OUT).
set -u
O=${OUT:-.}
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
export PYTHONPATH=$PWD
timeout 150 python lab/ncu_paged_small.py "$O/paged_batch1.json" 2>&1 | tail -8
for L in 1024 8192; do
  timeout 150 ncu --csv --page details --set full --clock-control none -k 'regex:_decode_split|paged_split_fast' \
    --launch-skip 6 --launch-count 3 python lab/ncu_paged_small.py --profile $L 16 > "$O/ncu_batch1_$L.csv" 2> "$O/ncu_$L.err"
  echo "ncu $L rc=$? $(wc -l < "$O/ncu_batch1_$L.csv") lines"; tail -3 "$O/ncu_$L.err"
done
