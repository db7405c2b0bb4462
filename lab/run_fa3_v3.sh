#!/usr/bin/env bash
# Chapter 10 on one H100 (prepared in session 35, issue 34): pingpong_overlap_fastexp (the softmax with the scale
# in one FMA a score) and pingpong_overlap_pinned (session 36) beside pingpong_overlap, cuDNN and fa2_forward (all 40
# shapes, its 97 correctness checks first), then the timelines (d = 128, N = 8k).   bash lab/run_fa3_v3.sh  (~7 min)
# The same run as lab/run_fa3_v4.sh (under 4 minutes), with the longer budgets.
TAG=v3 BUDGET=250 TL_BUDGET=110 exec bash "$(dirname "$0")/run_fa3_v4.sh"
