"""device.launch_check, the kernel that `cuda_available` compiles and runs on a real GPU before
it calls the GPU usable: here it runs on the GPU, or under the simulator (where
`cuda_available` itself does not call it)."""
import pytest

from gpu_testing import requires_cuda
from nprnn.core import device
from nprnn.kernels import gpu_common

pytestmark = requires_cuda


def test_launch_check_runs_a_kernel_and_reads_its_result():
    assert device.launch_check() is None


def test_launch_check_fails_when_the_kernel_writes_the_wrong_value(monkeypatch):
    def wrong_fill(a, value):
        gpu_common.fill_kernel[1, 32](a, a.dtype.type(2))
    monkeypatch.setattr(device, "fill", wrong_fill)
    with pytest.raises(RuntimeError, match="a kernel that writes 1.0 left another value"):
        device.launch_check()
