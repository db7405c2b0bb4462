set -x  # chapter 9 on a GPU: the notebooks and every chapter 9 test, then its bench suite (to $OUT/paged.json)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
python -m pytest -q -o addopts= -p no:cacheprovider --nbval-lax --nbval-current-env --doctest-modules tests/test_kernels_paged.py tests/test_paged_engine.py tests/test_checks_paged.py tests/test_reference_paged.py flashcourse/kernels/paged.py flashcourse/kernels/paged_write.py flashcourse/checks/paged.py flashcourse/checks/paged_walk.py flashcourse/checks/paged_predict.py flashcourse/viz/paged.py flashcourse/bench/paged.py notebooks/09_paged_attention.ipynb solutions/09_paged_attention.ipynb 2>&1 | tail -15
timeout 300 python -m flashcourse.cli bench paged --out $OUT/paged.json 2>&1 | tail -25
