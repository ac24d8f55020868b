"""GPU twins of nprnn/kernels/optim.py against their CPU twins: the squared gradient norm (a
two-pass reduction over several blocks, N = 37 elements over blocks of 4 threads) and the SGD
with momentum and Adagrad updates (N = 37 over blocks of 8: a ragged last block)."""
import numpy as np
import pytest

from gpu_testing import DTYPES, assert_close, dev, rand, requires_cuda
from nprnn.kernels import optim as K

pytestmark = requires_cuda
SIZE = 37


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_squares_matches_cpu(dtype):
    g = rand(np.random.default_rng(4), (SIZE,), dtype)
    out = np.array([0.25])                      # accumulates: += onto what is there
    K.sum_squares_cpu(out, g)
    out_gpu = dev(np.array([0.25]))
    K.sum_squares_gpu(out_gpu, dev(g), threads=4)
    assert_close(out_gpu, out, "float64", "sum of squares")
    with pytest.raises(ValueError, match="power of two"):
        K.sum_squares_gpu(out_gpu, dev(g), threads=6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", ["sgd", "adagrad"])
def test_update_matches_cpu(rule, dtype):
    rng = np.random.default_rng(5)
    p, g = rand(rng, (SIZE,), dtype), rand(rng, (SIZE,), dtype)
    state = np.abs(rand(rng, (SIZE,), dtype)) if rule == "adagrad" else rand(rng, (SIZE,), dtype)
    p_gpu, state_gpu = dev(p), dev(state)
    for _ in range(2):                          # two steps: the state carries over
        if rule == "sgd":
            K.sgd_momentum_cpu(p, state, g, 0.1, 0.9, 0.5)
            K.sgd_momentum_gpu(p_gpu, state_gpu, dev(g), 0.1, 0.9, 0.5, threads=8)
        else:
            K.adagrad_cpu(p, state, g, 0.1, 1e-7, 0.5)
            K.adagrad_gpu(p_gpu, state_gpu, dev(g), 0.1, 1e-7, 0.5, threads=8)
    assert_close(p_gpu, p, dtype, "parameters")
    assert_close(state_gpu, state, dtype, "optimizer state")
