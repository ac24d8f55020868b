"""The GPU twin of nprnn/kernels/noise.py against the CPU twin: the same noise, value for value,
from t0 on, with an odd count of values per example (the last pair gives one value) and more
pairs than the grid's threads (tests/gpu/conftest.py: 2 blocks), so its loop runs several rounds."""
import numpy as np

from gpu_testing import dev, requires_cuda
from nprnn.data import noise
from nprnn.kernels import noise as K

pytestmark = requires_cuda


def test_fill_matches_cpu():
    keys = np.array([[1, 0, 4], [1, 0, 5], [2, 1, 9]])
    x = np.full((3, 4, 7), 5.0, dtype=np.float32)          # from t0 = 1: 21 values per example
    want = x.copy()
    noise.fill_gaussian(want, 1, keys)
    x_gpu = dev(x)
    starts = dev(noise.stream_starts(keys.astype(np.uint64)))
    K.gaussian_fill_gpu(x_gpu, 1, starts, threads=4)        # 3 x 11 pairs over 2 blocks of 4
    got = x_gpu.copy_to_host()
    assert np.all(got[:, 0] == 5.0)                         # before t0: untouched
    # a few float32 units in the last place: the GPU contracts multiply-adds into FMAs
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6), np.abs(got - want).max()


def test_fill_gaussian_device_is_the_public_route():
    keys = np.column_stack([np.full(2, 3), np.arange(2)])
    want = np.zeros((2, 3, 2), dtype=np.float32)
    noise.fill_gaussian(want, 0, keys)
    x_gpu = dev(np.zeros((2, 3, 2), dtype=np.float32))
    noise.fill_gaussian_device(x_gpu, 0, keys)
    assert np.allclose(x_gpu.copy_to_host(), want, rtol=1e-6, atol=1e-6)
