"""The tasks: their raw files fetched and checked (sources.py), cached as HDF5 and served in
batches (datasets.py), with the noise of the noise-padded tasks (noise.py). Imports core/ for
the device, util/ and kernels/."""
