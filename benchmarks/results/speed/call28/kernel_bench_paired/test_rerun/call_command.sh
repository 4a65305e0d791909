CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "paired_rows"
