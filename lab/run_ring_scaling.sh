#!/usr/bin/env bash
# Issue 36: chapter 11's ring on 4 GPUs of one host beside 2 GPUs and 1 GPU of the same host, and PyTorch's
# context_parallel, fp16 (and one bf16 N), d = 128, causal (zigzag) and not. Each torchrun writes its own JSON under
# $OUT (a run that hangs or runs out of time loses only itself).
#   bash lab/run_ring_scaling.sh a     # NCCL tests on 4 ranks; 4 and 2 GPUs at 64k and 256k; 4 GPUs at 512k
#   bash lab/run_ring_scaling.sh b     # 2 GPUs at 512k; 4 GPUs at 1M (causal); 4 GPUs in bf16 at 256k
#   bash lab/run_ring_scaling.sh c     # 4 GPUs at 1M (not causal, one rep); then at once, bf16 on 2 GPUs (issue 35):
#                                      # GPUs 0,1 at 32k-256k and GPUs 2,3 at 512k (separate NVLink pairs and ports)
#   bash lab/run_ring_scaling.sh d     # on a machine of 2 GPUs: c's bf16 runs one after the other
set -u
O=${OUT:-.}
part=${1:-a}
nvidia-smi -L > "$O/gpus_$part.txt"
four() { tag=$1; shift; timeout "$T" torchrun --nproc-per-node 4 -m flashcourse.bench.ring --out "$O/ring4_$tag.json" "$@" \
           > "$O/ring4_$tag.log" 2>&1; echo "4 GPUs $tag rc=$?"; }
two() { tag=$1; shift; CUDA_VISIBLE_DEVICES=0,1 timeout "$T" torchrun --nproc-per-node 2 -m flashcourse.bench.ring \
           --out "$O/ring2_$tag.json" --impls "ring,ring compute,ring comm,context_parallel" "$@" \
           > "$O/ring2_$tag.log" 2>&1; echo "2 GPUs $tag rc=$?"; }
pair() { tag=$1; devs=$2; port=$3; shift 3; CUDA_VISIBLE_DEVICES=$devs timeout "$T" torchrun --nproc-per-node 2 \
           --master-port "$port" -m flashcourse.bench.ring --out "$O/ring2_$tag.json" "$@" > "$O/ring2_$tag.log" 2>&1
           echo "2 GPUs ($devs) $tag rc=$?"; }
if [ "$part" = c ]; then
  T=300 four 1m_noncausal --Ns 1048576 --causal false --timeline-N 0 --reps 1
  T=230 pair bf16_32k_256k 0,1 29511 --Ns 32768,65536,131072,262144 --dtype bfloat16 --timeline-N 0 &
  T=230 pair bf16_512k 2,3 29522 --Ns 524288 --dtype bfloat16 --timeline-N 0 --reps 2 &
  wait
elif [ "$part" = d ]; then
  T=230 pair bf16_32k_256k 0,1 29511 --Ns 32768,65536,131072,262144 --dtype bfloat16 --timeline-N 0
  T=280 pair bf16_512k 0,1 29522 --Ns 524288 --dtype bfloat16 --timeline-N 0 --reps 2
elif [ "$part" = a ]; then
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
