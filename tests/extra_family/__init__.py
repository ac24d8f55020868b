"""A cell family that nprnn does not ship, in the three files a new family is: its kernels
(kernels.py), its float64 reference (reference.py) and its spec (spec.py). Registered, it gets
every registry-driven check: tests/test_extra_family.py runs the CPU ones, PTX, bench and the
layers, tests/gpu/test_gpu_extra_family.py the GPU twin ones."""
