"""GPU twins of nprnn/kernels/readout.py against their CPU twins: the linear readout, the softmax
cross-entropy with its gradient, the mean squared error with its gradient (loss="mse"; also
through a model on cuda), and the readout's backward. B = 3 rows, K = 4 or 2 classes (more
and fewer than the rows: the backward kernel's threads cover max(B, K) rows) and n = 6 units over
blocks of 2 x 2, 2 and 4 x 2 threads: every kernel runs several ragged blocks."""
import numpy as np
import pytest

import nprnn
from gpu_testing import (B, DTYPES, M, N, T, assert_close, dev, empty_like, rand, requires_cuda,
                         small_launch)
from nprnn.kernels import readout as K

pytestmark = requires_cuda


@pytest.mark.parametrize("classes", [4, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_readout_forward_loss_and_backward_match_cpu(dtype, classes):
    rng = np.random.default_rng(3)
    h, W_out = rand(rng, (B, N), dtype), rand(rng, (classes, N), dtype)
    b_out = rand(rng, (classes,), dtype)
    y = np.array([3, 0, 2], dtype=np.int64) % classes
    logits = np.empty((B, classes), dtype)
    K.readout_forward_cpu(logits, h, W_out, b_out)
    logits_gpu = empty_like(logits)
    K.readout_forward_gpu(logits_gpu, dev(h), dev(W_out), dev(b_out), block=(2, 2))
    assert_close(logits_gpu, logits, dtype, "logits")

    # large logits: the row maximum must be subtracted before exp, as on the CPU
    logits = (logits * 40).astype(dtype)
    losses, dlogits = np.empty(B, dtype), np.empty_like(logits)
    w = np.full(B, 1.0 / (B - 1))
    w[1] = 0.0                                # a row that does not count: 0 in both
    K.softmax_xent_cpu(losses, dlogits, logits, y, w)
    losses_gpu, dlogits_gpu = empty_like(losses), empty_like(dlogits)
    K.softmax_xent_gpu(losses_gpu, dlogits_gpu, dev(logits), dev(y), dev(w), threads=2)
    assert losses[1] == 0 and not dlogits[1].any()
    assert np.isfinite(losses).all()
    assert_close(losses_gpu, losses, dtype, "losses")
    assert_close(dlogits_gpu, dlogits, dtype, "dlogits")

    dW_out, db_out, dh = np.empty_like(W_out), np.empty_like(b_out), np.empty_like(h)
    K.readout_backward_cpu(dW_out, db_out, dh, dlogits, h, W_out)
    g = dict(dW_out=empty_like(W_out), db_out=empty_like(b_out), dh=empty_like(h))
    K.readout_backward_gpu(g["dW_out"], g["db_out"], g["dh"], dev(dlogits), dev(h), dev(W_out),
                           block=(4, 2))
    for k, want in (("dW_out", dW_out), ("db_out", db_out), ("dh", dh)):
        assert_close(g[k], want, dtype, k)


@pytest.mark.parametrize("outputs", [4, 1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_matches_cpu(dtype, outputs):
    """mse_gpu against mse_cpu over ragged blocks of 2 threads, then the backward of its dout."""
    rng = np.random.default_rng(4)
    out, y = rand(rng, (B, outputs), dtype, 3.0), rand(rng, (B, outputs), dtype)
    losses, dout = np.empty(B, dtype), np.empty_like(out)
    w = np.full(B, 1.0 / B)
    K.mse_cpu(losses, dout, out, y, w)
    losses_gpu, dout_gpu = empty_like(losses), empty_like(dout)
    K.mse_gpu(losses_gpu, dout_gpu, dev(out), dev(y), dev(w), threads=2)
    assert losses.mean() > 0.1 and np.abs(dout).max() > 0.1       # not all zeros, for a start
    assert_close(losses_gpu, losses, dtype, "losses")
    assert_close(dout_gpu, dout, dtype, "dout")

    h, W_out = rand(rng, (B, N), dtype), rand(rng, (outputs, N), dtype)
    dW_out, db_out, dh = np.empty_like(W_out), np.empty(outputs, dtype), np.empty_like(h)
    K.readout_backward_cpu(dW_out, db_out, dh, dout, h, W_out)
    g = dict(dW_out=empty_like(W_out), db_out=empty_like(db_out), dh=empty_like(h))
    K.readout_backward_gpu(g["dW_out"], g["db_out"], g["dh"], dout_gpu, dev(h), dev(W_out),
                           block=(4, 2))
    for k, want in (("dW_out", dW_out), ("db_out", db_out), ("dh", dh)):
        assert_close(g[k], want, dtype, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_mse_model_on_cuda_matches_cpu(dtype, monkeypatch):
    """make_model(..., loss="mse") on cuda: the targets uploaded in the model's dtype, the mse
    kernel run in place of the softmax, the loss, the outputs and every gradient as on the CPU."""
    small_launch(monkeypatch)
    kw = dict(seed=3, dtype=dtype, loss="mse", output_size=2, eps=0.5)
    cpu = nprnn.make_model("antisym-gated", M, N, **kw)
    gpu = nprnn.make_model("antisym-gated", M, N, device="cuda", **kw)
    gpu.gpu_version = "step"
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((B, T, M)), rng.standard_normal((B, 2))
    loss_c, g_c, out_c = cpu.loss_and_grad(x, y, return_logits=True)
    loss_g, g_g, out_g = gpu.loss_and_grad(x, y, return_logits=True)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert loss_c > 0.1 and abs(loss_g - loss_c) <= tol * max(1.0, loss_c)
    assert_close(out_g, out_c, dtype, "outputs")
    assert set(g_g) == set(g_c)
    for k in g_c:
        assert_close(g_g[k], g_c[k], dtype, f"grad {k}")
    y_step = gpu.step_arrays(x, y).y
    assert y_step.dtype == np.dtype(dtype) and y_step.shape == (B, 2)
