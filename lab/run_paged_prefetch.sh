set -x  # chapter 9's paged_decode with page numbers loaded a step ahead on small grids: its tests, then the bench suite
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python -m pytest -q -o addopts= -p no:cacheprovider --doctest-modules tests/test_kernels_paged.py flashcourse/kernels/paged.py 2>&1 | tail -4
timeout 300 python -m flashcourse.cli bench paged --out $OUT/paged.json 2>&1 | tail -25
