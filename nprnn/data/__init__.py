"""The tasks: their raw files fetched and checked (sources.py), images made sequences and the
registry of tasks (tasks.py), the adding and copy tasks drawn from keys (synthetic.py), the HDF5
cache (cache.py), batches over it (datasets.py, whose get_task is the door), the noise of the
noise-padded tasks (noise.py), and what `data info` says (info.py). Imports core/ for the
device, util/ and kernels/."""
