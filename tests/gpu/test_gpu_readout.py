"""GPU twins of nprnn/kernels/readout.py against their CPU twins: the linear readout, the softmax
cross-entropy with its gradient, and the readout's backward. B = 3 rows, K = 4 or 2 classes (more
and fewer than the rows: the backward kernel's threads cover max(B, K) rows) and n = 6 units over
blocks of 2 x 2, 2 and 4 x 2 threads: every kernel runs several ragged blocks."""
import numpy as np
import pytest

from gpu_testing import B, DTYPES, N, assert_close, dev, empty_like, rand, requires_cuda
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
    K.softmax_xent_cpu(losses, dlogits, logits, y)
    losses_gpu, dlogits_gpu = empty_like(losses), empty_like(dlogits)
    K.softmax_xent_gpu(losses_gpu, dlogits_gpu, dev(logits), dev(y), threads=2)
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
