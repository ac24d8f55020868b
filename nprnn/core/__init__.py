"""The model: cells (cells.py) over their float64 references (reference.py), the readout and
loss (model.py), the optimisers (optim.py), and where the kernels run (backends.py, device.py,
memory.py, inputs.py, autotune.py). Imports only util/ and kernels/."""
# registers coRNN and LEM in cells.CELLS, wherever the registry is read from
from . import successors  # noqa: F401,E402
