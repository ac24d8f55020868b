"""Settings every GPU test shares."""
import os

import pytest

from nprnn.kernels import gpu_common


@pytest.fixture(autouse=True)
def few_line_blocks(monkeypatch):
    """1-d element-wise launches (gpu_common.line_launch) take at most 2 blocks, so that at the
    tests' sizes their kernels' grid-stride loops run several rounds, and the simulator, which
    runs each GPU thread in Python, runs a few hundred threads where it ran thousands."""
    monkeypatch.setattr(gpu_common, "LINE_BLOCKS", 2)


def pytest_collection_modifyitems(config, items):
    """NPRNN_TEST_SHARD=i/n keeps the i-th of every n tests (i from 1): tests/test_cuda.py runs
    the longest files under the simulator in n processes, so that none is the suite's last."""
    shard = os.environ.get("NPRNN_TEST_SHARD")
    if not shard:
        return
    i, n = (int(k) for k in shard.split("/"))
    kept, left = [], []
    for k, item in enumerate(items):
        (kept if k % n == i - 1 else left).append(item)
    config.hook.pytest_deselected(items=left)
    items[:] = kept
