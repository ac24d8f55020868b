"""kernels/layout.py's GPU twins against the CPU twin: (B, T, m) batches to time-major, in the
same dtype and converted, with more rows and steps than one block of threads covers."""
import numpy as np
import pytest

from gpu_testing import dev, requires_cuda
from nprnn.kernels import layout as K

pytestmark = requires_cuda


@pytest.mark.parametrize("src, dst", [("float32", "float32"), ("float64", "float64"),
                                      ("float32", "float64")])
def test_time_major_matches_cpu(src, dst):
    x = np.random.default_rng(0).standard_normal((3, 5, 2)).astype(src)
    want = np.empty((5, 3, 2), dtype=dst)
    assert K.time_major_cpu(want, x) == 0
    got = dev(np.zeros((5, 3, 2), dtype=dst))
    K.time_major_gpu(got, dev(x), threads=4)      # 30 values over 2 blocks of 4: 4 rounds
    assert np.array_equal(got.copy_to_host(), want)
    assert np.array_equal(want, x.transpose(1, 0, 2))


def test_copy_leading_steps_matches_numpy():
    rng = np.random.default_rng(1)
    x, head = rng.standard_normal((3, 6, 2)), rng.standard_normal((3, 2, 2))
    got = dev(x)
    K.copy_leading_steps_gpu(got, dev(head), threads=4)
    want = x.copy()
    want[:, :2] = head
    assert np.array_equal(got.copy_to_host(), want)
