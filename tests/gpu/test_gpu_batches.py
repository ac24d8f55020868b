"""Batches on the device (`Task.batches(device="cuda")`) against the host batches: the image part
copied, the noise drawn on the GPU; and a model fed device batches against the same model fed host
batches. Fake MNIST (60 + 20 digits in the official IDX format) stands in for the real files."""
import sys
from pathlib import Path

import numpy as np
import pytest

import gpu_testing as gt
import nprnn
from nprnn import gpu, sources
from nprnn.datasets import get_task
from nprnn.kernels.gpu_common import to_host

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))        # tests/: fake_data
import fake_data as fd                                                # noqa: E402

pytestmark = gt.requires_cuda


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    arrays = fd.write_fake_mnist(tmp_path / "mnist")
    monkeypatch.setitem(sources.SOURCES, "mnist", fd.fake_idx_source(tmp_path, arrays=arrays))
    return tmp_path


@pytest.mark.parametrize("name, T", [("padded-mnist", 3), ("mnist-noise", 30), ("mnist", None)])
def test_device_batches_equal_host_batches(data_dir, name, T):
    with get_task(name, data_dir=data_dir, T=T, progress=False) as task:
        for split, kw in (("train", dict(seed=2, epoch=1, start=1)), ("test", {})):
            host = list(task.batches(split, 7, **kw))[:2]
            dev = list(task.batches(split, 7, device="cuda", **kw))[:2]
            for (xh, yh), (xd, yd) in zip(host, dev):
                assert gpu.is_device_array(xd) and xd.dtype == np.float32
                np.testing.assert_array_equal(yd, yh)
                # the image part is copied; the noise agrees to a few float32 ulps (GPU FMAs)
                np.testing.assert_allclose(xd.copy_to_host(), xh, rtol=1e-6, atol=1e-6)
        with pytest.raises(ValueError, match="device must be one of cpu, cuda"):
            next(task.batches("test", 7, device="gpu"))


def test_model_takes_device_batches(data_dir, monkeypatch):
    monkeypatch.setitem(gpu.LAUNCH, "readout_block", (4, 2))
    with get_task("padded-mnist", data_dir=data_dir, T=3, progress=False) as task:
        (xh, y), = list(task.batches("test", 4))[:1]
        (xd, _), = list(task.batches("test", 4, device="cuda"))[:1]
    model = nprnn.make_model("antisym", task.m, 5, 10, eps=0.5, seed=1, dtype="float64",
                             device="cuda")
    loss_h, grads_h = model.loss_and_grad(xh, y)
    loss_d, grads_d = model.loss_and_grad(xd, y)
    # the device batch's noise differs from the host's in the last float32 bits at most
    assert abs(loss_d - loss_h) < 1e-5
    for k in grads_h:
        np.testing.assert_allclose(to_host(grads_d[k]), to_host(grads_h[k]),
                                   rtol=1e-4, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(model.forward(xd), model.forward(xh), rtol=1e-5, atol=1e-6)
    cpu_model = nprnn.make_model("antisym", task.m, 5, 10, eps=0.5, seed=1, dtype="float64")
    with pytest.raises(TypeError, match="GPU array but this model is on the cpu"):
        cpu_model.loss_and_grad(xd, y)
    with pytest.raises(ValueError, match="m = input_size = 784"):
        model.loss_and_grad(gpu.to_device(np.zeros((4, 3, 5), np.float32)), y)


def test_data_benchmark_on_cuda(monkeypatch, capsys):
    """benchmarks/bench_data.py --device cuda at tiny sizes: batches made on the device, the
    step on the device, and the GPU noise rate printed."""
    import runpy
    monkeypatch.setitem(gpu.LAUNCH, "readout_block", (4, 2))
    monkeypatch.setattr(sys, "argv", ["bench_data.py", "--device", "cuda", "--tasks", "",
                                      "--synthetic", "cifar10-noise", "--batch-size", "2",
                                      "--hidden", "3", "--batches", "1", "--steps", "1",
                                      "--T", "33"])
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks" / "bench_data.py"),
                   run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("device cuda, B=2")
    row = next(line.split() for line in out if line.startswith("cifar10-noise*"))
    assert row[1:3] == ["33", "96"] and row[-1] == "-"
    assert "nprnn.noise on the GPU" in out[-2]


def test_a_head_longer_than_the_sequence_is_refused_before_any_copy():
    """On a GPU an oversized head would be written past x unchecked (kernels do no bounds
    checks), so head_then_noise refuses it first."""
    with pytest.raises(ValueError, match="head's 5 steps do not fit in T = 4"):
        gpu.head_then_noise(np.zeros((2, 5, 3), np.float32), 4, np.zeros((2, 2), np.int64))
