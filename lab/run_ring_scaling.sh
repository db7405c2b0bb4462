#!/usr/bin/env bash
# Issue 36: chapter 11's ring on 4 GPUs of one host beside 2 GPUs and 1 GPU of the same host, and PyTorch's
# context_parallel, fp16 (and one bf16 N), d = 128, causal (zigzag) and not. Each torchrun writes its own JSON under
# $OUT (a run that hangs or runs out of time loses only itself).
#   bash lab/run_ring_scaling.sh a     # NCCL tests on 4 ranks; 4 and 2 GPUs at 64k and 256k; 4 GPUs at 512k
#   bash lab/run_ring_scaling.sh b     # 2 GPUs at 512k; 4 GPUs at 1M (causal); 4 GPUs in bf16 at 256k
set -u
O=${OUT:-.}
part=${1:-a}
nvidia-smi -L > "$O/gpus_$part.txt"
four() { tag=$1; shift; timeout "$T" torchrun --nproc-per-node 4 -m flashcourse.bench.ring --out "$O/ring4_$tag.json" "$@" \
           > "$O/ring4_$tag.log" 2>&1; echo "4 GPUs $tag rc=$?"; }
two() { tag=$1; shift; CUDA_VISIBLE_DEVICES=0,1 timeout "$T" torchrun --nproc-per-node 2 -m flashcourse.bench.ring \
           --out "$O/ring2_$tag.json" --impls "ring,ring compute,ring comm,context_parallel" "$@" \
           > "$O/ring2_$tag.log" 2>&1; echo "2 GPUs $tag rc=$?"; }
if [ "$part" = a ]; then
  timeout 150 python -m pytest -q -o addopts="" tests/test_distributed_ring.py > "$O/tests_nccl.txt" 2>&1
  echo "tests rc=$?"; tail -2 "$O/tests_nccl.txt"
  T=150 four 64k_256k --Ns 65536,262144 --timeline-N 262144
  T=120 two 64k_256k --Ns 65536,262144 --timeline-N 0
  T=200 four 512k --Ns 524288 --timeline-N 0 --reps 2
else
  T=170 two 512k --Ns 524288 --timeline-N 0 --reps 2
  T=220 four 1M --Ns 1048576 --causal true --timeline-N 0 --reps 2
  T=120 four 256k_bf16 --Ns 262144 --dtype bfloat16 --timeline-N 0
fi
