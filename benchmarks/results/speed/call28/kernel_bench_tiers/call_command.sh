CUDA_VISIBLE_DEVICES=0 python3 benchmarks/sparse_kernel_bench.py --variants fused_packed_narrow,fused_exit_narrow --batch 16 --contexts 32768,33024,34816,36864,37120,40960 --out $K/kb_tiers.json
