"""GPU kernels of the sparse decode path (Triton), with pure-PyTorch references.

``reference`` imports on any machine; ``sparse_decode`` needs Triton and a CUDA GPU.
"""
