set -x  # chapter 9 on a GPU: its tests, then lab/gpu_paged.py (to $OUT/paged_one_launch.json) and lab/gpu_paged_engine.py
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
python -m pytest -q -o addopts= -p no:cacheprovider --doctest-modules tests/test_kernels_paged.py tests/test_paged_engine.py flashcourse/paged_engine flashcourse/kernels/paged.py flashcourse/kernels/paged_write.py flashcourse/kernels/launch.py 2>&1 | tail -15
PYTHONPATH=. timeout 200 python lab/gpu_paged.py $OUT/paged_one_launch.json 2>&1 | tail -20
PYTHONPATH=. timeout 330 python lab/gpu_paged_engine.py $OUT/paged_engine.json 2>&1 | tail -12
