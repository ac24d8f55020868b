"""What trained runs did and how fast the kernels run: dynamics, Jacobians and gates
(analysis.py), their figures (plotting.py), the benchmark (bench.py)."""
