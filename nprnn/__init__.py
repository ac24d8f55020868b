"""nprnn: AntisymmetricRNN (Chang et al., ICLR 2019) and its baselines in NumPy + Numba.

    import nprnn
    model = nprnn.make_model("antisym", input_size=1, hidden_size=128, num_classes=10)
    loss, grads = model.loss_and_grad(x, y)     # x (B, T, m) float, y (B,) int
    # regression: make_model(..., output_size=K, loss="mse"); y (B, K) float (docs/models.md)

`nprnn.CELLS` lists the models; see README.md for the reading order of the kernels.
"""
from .core.cells import CELLS
from .core.model import Model, make_model

__all__ = ["CELLS", "Model", "make_model"]
