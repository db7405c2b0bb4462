#!/usr/bin/env bash
# Every grade test on one GPU (issue 31): the grading suite and each chapter's grade of its untouched and completed
# exercise, with the notebooks run on the GPU.   bash lab/run_grade_gpu.sh   (carry .whl: nbval, xdist; about 3 minutes)
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
pip install -q --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
# the machine's packages came without compiled files (pip's default writes them): concurrent test processes would
# write them during another's grade, which sees new files in its installation and refuses; compile them first
python -m compileall -q -j 16 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" /tmp/site > /dev/null 2>&1
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 560 python -m pytest -o addopts="" -n 6 --dist loadfile -q -p no:cacheprovider --durations=15 tests/test_grading.py tests/test_grading_isolation.py tests/test_grading_kernel_start.py tests/test_grading_verdict.py "tests/test_checks_"*.py -k "grading or grade" > $OUT/grade.log 2>&1; echo rc=$?
tail -45 $OUT/grade.log
