timeout 75 python3 benchmarks/gpu_host/breaks.py run --gpus 0,1 --out $OUT/b --only paired_count_kept paired_halves_gap
