"""The fast GPU versions of each cell family's kernels (see kernels/fast/antisym.py)."""
