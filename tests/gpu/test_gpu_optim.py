"""GPU twins of nprnn/kernels/optim.py against their CPU twins: the squared gradient norm (a
two-pass reduction over several blocks, N = 37 elements over blocks of 4 threads), the SGD with
momentum, Adagrad and Adam updates (N = 37 over 2 blocks of 8: three rounds of their grid-stride
loops, the last ragged), and the per-step bookkeeping (record_step)."""
import numpy as np
import pytest

from gpu_testing import DTYPES, assert_close, dev, rand, requires_cuda
from nprnn.kernels import optim as K

pytestmark = requires_cuda
SIZE = 37


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [SIZE, 301])       # 301 > 64 blocks x 4 threads: a grid stride
def test_sum_squares_matches_cpu(dtype, size):
    g = rand(np.random.default_rng(4), (size,), dtype)
    out = np.array([0.25])                      # accumulates: += onto what is there
    K.sum_squares_cpu(out, g)
    out_gpu = dev(np.array([0.25]))
    K.sum_squares_gpu(out_gpu, dev(g), threads=4)
    assert_close(out_gpu, out, "float64", "sum of squares")
    with pytest.raises(ValueError, match="power of two"):
        K.sum_squares_gpu(out_gpu, dev(g), threads=6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", ["sgd", "adagrad", "adam"])
def test_update_matches_cpu(rule, dtype):
    rng = np.random.default_rng(5)
    p, g = rand(rng, (SIZE,), dtype), rand(rng, (SIZE,), dtype)
    state = np.abs(rand(rng, (SIZE,), dtype)) if rule == "adagrad" else rand(rng, (SIZE,), dtype)
    m = rand(rng, (SIZE,), dtype)                     # Adam's first moment (v is `state`)
    state = np.abs(state) if rule == "adam" else state
    p_gpu, state_gpu, m_gpu = dev(p), dev(state), dev(m)
    for t, s in enumerate((0.5, 1.0, np.nan), start=1):   # the state carries over; NaN: none
        scale = np.array([s])
        if rule == "sgd":
            K.sgd_momentum_cpu(p, state, g, 0.1, 0.9, scale)
            K.sgd_momentum_gpu(p_gpu, state_gpu, dev(g), 0.1, 0.9, dev(scale), threads=8)
        elif rule == "adagrad":
            K.adagrad_cpu(p, state, g, 0.1, 1e-7, scale)
            K.adagrad_gpu(p_gpu, state_gpu, dev(g), 0.1, 1e-7, dev(scale), threads=8)
        else:
            c = (1 - 0.9 ** t, (1 - 0.999 ** t) ** 0.5)
            K.adam_cpu(p, m, state, g, 0.1, 0.9, 0.999, 1e-8, *c, scale)
            K.adam_gpu(p_gpu, m_gpu, state_gpu, dev(g), 0.1, 0.9, 0.999, 1e-8, *c, dev(scale),
                       threads=8)
    assert_close(p_gpu, p, dtype, "parameters")
    assert_close(state_gpu, state, dtype, "optimizer state")
    assert_close(m_gpu, m, dtype, "Adam's first moment")


@pytest.mark.parametrize("dtype", DTYPES)
def test_record_step_matches_cpu(dtype):
    rng = np.random.default_rng(6)
    stats, stats_gpu = np.zeros(K.STATS), dev(np.zeros(K.STATS))
    scale, scale_gpu = np.zeros(1), dev(np.zeros(1))
    y = np.array([0, 2, 1, 2, 0], dtype=np.int64)
    for total, clip in ((4.0, 0.0), (16.0, 2.0), (np.inf, 1.0), (1.0, 1.0)):   # 3rd: bad
        losses, logits = rand(rng, (5,), dtype) ** 2, rand(rng, (5, 3), dtype)
        w = np.array([0.25, 0.25, 0.0, 0.25, 0.25])     # row 2 does not count
        K.record_step_cpu(stats, scale, losses, logits, y, w, np.array([total]), clip)
        K.record_step_gpu(stats_gpu, scale_gpu, dev(losses), dev(logits), dev(y), dev(w),
                          dev(np.array([total])), clip)
        np.testing.assert_allclose(stats_gpu.copy_to_host(), stats, rtol=1e-12,
                                   err_msg=f"running totals after ||g||^2 = {total}")
        np.testing.assert_array_equal(scale_gpu.copy_to_host(), scale)
    assert stats[K.FIRST_BAD] == 3 and np.isnan(scale[0])
