"""The readout's mean squared error (make_model(..., loss="mse")), kernel by kernel on the CPU:

    its definition (torch.nn.functional.mse_loss, reduction "mean", written out in NumPy)
    -> reference.readout_mse_loss / readout_mse_backward (float64) -> mse_cpu and the readout's
    @njit kernels, in float64 and float32

The finite differences of the whole model under loss="mse" are in tests/test_cells.py (every
cell, parametrised by loss), the GPU twin against this CPU twin in tests/gpu/test_gpu_readout.py.
"""
import numpy as np
import pytest

import nprnn
from nprnn.core import reference
from nprnn.core.gradcheck import relative_error
from nprnn.kernels import readout as K_readout

B, N = 3, 5


def torch_mse(out, y):
    """torch.nn.functional.mse_loss(out, y) (reduction "mean") and its gradient w.r.t. out, as
    PyTorch defines them: the mean over every element of (out - y)^2; 2 (out - y) / numel."""
    return ((out - y) ** 2).mean(), 2.0 * (out - y) / out.size


def run_mse_kernels(h, W_out, b_out, y):
    """The CPU kernels of a training step's readout: (out, losses, dout, dW_out, db_out, dh)."""
    out = np.empty((h.shape[0], W_out.shape[0]), h.dtype)
    K_readout.readout_forward_cpu(out, h, W_out, b_out)
    losses, dout = np.empty(h.shape[0], h.dtype), np.empty_like(out)
    K_readout.mse_cpu(losses, dout, out, y, np.full(h.shape[0], 1.0 / h.shape[0]))
    dW_out, db_out, dh = np.empty_like(W_out), np.empty_like(b_out), np.empty_like(h)
    K_readout.readout_backward_cpu(dW_out, db_out, dh, dout, h, W_out)
    return out, losses, dout, dW_out, db_out, dh


def test_mse_on_a_small_case_by_hand():
    """out - y = [[1, 0], [2, 4]]: squares 1, 0, 4, 16, mean 21/4; the rows' means 1/2 and 10;
    dout = 2 (out - y) / 4. Exact in both dtypes."""
    for dtype in (np.float32, np.float64):
        out = np.array([[1.0, 2.0], [3.0, 5.0]], dtype)
        y = np.array([[0.0, 2.0], [1.0, 1.0]], dtype)
        losses, dout = np.empty(2, dtype), np.empty_like(out)
        K_readout.mse_cpu(losses, dout, out, y, np.full(2, 0.5))
        np.testing.assert_array_equal(losses, [0.5, 10.0])
        np.testing.assert_array_equal(dout, [[0.5, 0.0], [1.0, 2.0]])
        loss, dout_torch = torch_mse(out.astype(np.float64), y.astype(np.float64))
        assert losses.mean() == loss == 5.25
        np.testing.assert_array_equal(dout, dout_torch)


@pytest.mark.parametrize("outputs", [4, 1])
def test_reference_is_torchs_mse_of_the_linear_readout(outputs):
    rng = np.random.default_rng(0)
    h, W_out = rng.standard_normal((B, N)), rng.standard_normal((outputs, N))
    b_out, y = rng.standard_normal(outputs), rng.standard_normal((B, outputs))
    loss, out, cache = reference.readout_mse_loss(h, W_out, b_out, y)
    np.testing.assert_allclose(out, h @ W_out.T + b_out, rtol=1e-14)
    want_loss, dout = torch_mse(out, y)
    assert loss == want_loss
    dW_out, db_out, dh = reference.readout_mse_backward(cache)
    np.testing.assert_allclose(dW_out, dout.T @ h, rtol=1e-14)
    np.testing.assert_allclose(db_out, dout.sum(axis=0), rtol=1e-14)
    np.testing.assert_allclose(dh, dout @ W_out, rtol=1e-14)


@pytest.mark.parametrize("outputs", [4, 1])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_mse_kernels_match_reference(dtype, outputs):
    """float64 to rounding; float32 to its precision (relative 1e-5 of the largest entry)."""
    rng = np.random.default_rng(1)
    h, W_out, b_out, y = (rng.standard_normal(s).astype(dtype) for s in
                          ((B, N), (outputs, N), (outputs,), (B, outputs)))
    out, losses, dout, dW_out, db_out, dh = run_mse_kernels(h, W_out, b_out, y)
    ref_loss, ref_out, cache = reference.readout_mse_loss(h, W_out, b_out, y)
    ref_dW_out, ref_db_out, ref_dh = reference.readout_mse_backward(cache)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert losses.dtype == dout.dtype == np.dtype(dtype)
    assert abs(float(losses.mean()) - ref_loss) <= tol * max(1.0, ref_loss)
    np.testing.assert_allclose(losses, ((ref_out - y) ** 2).mean(axis=1), rtol=tol)
    for what, got, want in (("out", out, ref_out), ("dW_out", dW_out, ref_dW_out),
                            ("db_out", db_out, ref_db_out), ("dh", dh, ref_dh)):
        assert relative_error(got, want) < tol, what
    assert relative_error(dout, 2.0 * (ref_out - y) / (B * outputs)) < tol


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_mse_of_outputs_equal_to_the_targets_is_zero_with_zero_gradients(dtype):
    """Targets that are the model's own outputs: loss 0, and every gradient exactly 0 (the
    readout's dout is 0, and BPTT is linear in dh_T)."""
    model = nprnn.make_model("antisym-gated", 2, N, 3, loss="mse", dtype=dtype, seed=3)
    x = np.random.default_rng(2).standard_normal((B, 6, 2)).astype(dtype)
    y = model.forward(x)
    loss, grads, out = model.loss_and_grad(x, y, return_logits=True)
    np.testing.assert_array_equal(out, y)
    assert loss == 0.0
    for key, g in grads.items():
        assert not np.any(g), key
    # and targets one off everywhere: the loss is 1, dout 2 / (B K) through b_out's gradient
    loss, grads = model.loss_and_grad(x, y - 1)
    assert loss == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(grads["b_out"], np.full(3, 2.0 / 3), rtol=1e-6)


@pytest.mark.parametrize("loss", ["xent", "mse"])
def test_readout_kernels_split_over_many_row_blocks_match_numpy(loss):
    """A readout at every step has T*B rows, which the CPU twins split across threads in blocks
    of BLOCK_ROWS (kernels/common.py): over 3 blocks and a ragged one, with rows that do not
    count (w = 0), they give NumPy's float64 result."""
    from nprnn.kernels.common import BLOCK_ROWS
    rng = np.random.default_rng(4)
    R, K, n = 3 * BLOCK_ROWS + 5, 4, 6
    h, W_out, b_out = (rng.standard_normal(s) for s in ((R, n), (K, n), (K,)))
    w = np.where(rng.random(R) < 0.2, 0.0, 1.0)
    w /= w.sum()
    out = np.empty((R, K))
    K_readout.readout_forward_cpu(out, h, W_out, b_out)
    np.testing.assert_allclose(out, h @ W_out.T + b_out, rtol=1e-12)
    losses, dout = np.empty(R), np.empty((R, K))
    if loss == "xent":
        y = rng.integers(0, K, R)
        K_readout.softmax_xent_cpu(losses, dout, out, y, w)
        p = np.exp(out - out.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        want = -np.log(p[np.arange(R), y])
        want_dout = w[:, None] * (p - np.eye(K)[y])
    else:
        y = rng.standard_normal((R, K))
        K_readout.mse_cpu(losses, dout, out, y, w)
        want, want_dout = ((out - y) ** 2).mean(axis=1), w[:, None] * 2 * (out - y) / K
    np.testing.assert_allclose(losses, np.where(w > 0, want, 0.0), rtol=1e-12)
    # w (p_y - 1) cancels where p_y is near 1: an absolute error of a few ulps of w
    np.testing.assert_allclose(dout, want_dout, rtol=1e-12, atol=4 * np.finfo(float).eps * w.max())
    dW_out, db_out, dh = np.empty_like(W_out), np.empty_like(b_out), np.empty_like(h)
    K_readout.readout_backward_cpu(dW_out, db_out, dh, dout, h, W_out)
    np.testing.assert_allclose(dW_out, dout.T @ h, rtol=1e-12)
    np.testing.assert_allclose(db_out, dout.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(dh, dout @ W_out, rtol=1e-12)
