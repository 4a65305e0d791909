# the offline sm_90 compile of the kvstore variants at d33c86e (Triton bundled ptxas; no GPU)
git worktree add /tmp/wt40 d33c86e && cd /tmp/wt40 && PYTHONPATH=/tmp/wt40 python benchmarks/selection_kernel_resources.py | grep kvstore
