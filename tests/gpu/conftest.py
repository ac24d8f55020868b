"""Settings every GPU test shares."""
import pytest

from nprnn.kernels import gpu_common


@pytest.fixture(autouse=True)
def few_line_blocks(monkeypatch):
    """1-d element-wise launches (gpu_common.line_launch) take at most 2 blocks, so that at the
    tests' sizes their kernels' grid-stride loops run several rounds, and the simulator, which
    runs each GPU thread in Python, runs a few hundred threads where it ran thousands."""
    monkeypatch.setattr(gpu_common, "LINE_BLOCKS", 2)
