"""Batches on the device (`Task.batches(device="cuda")`) against the host batches: the image part
copied, the noise drawn on the GPU; and a model fed device batches against the same model fed host
batches. Fake MNIST (60 + 20 digits in the official IDX format) stands in for the real files."""
import sys
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

import gpu_testing as gt
import nprnn
from nprnn.core import memory
from nprnn.data import noise, sources
from nprnn.data.datasets import get_task
from nprnn.core.device import simulator_enabled
from nprnn.core.memory import to_host

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))        # tests/: fake_data
import fake_data as fd                                                # noqa: E402

pytestmark = gt.requires_cuda


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    arrays = fd.write_fake_mnist(tmp_path / "mnist")
    monkeypatch.setitem(sources.SOURCES, "mnist", fd.fake_idx_source(tmp_path, arrays=arrays))
    return tmp_path


@pytest.mark.parametrize("name, T, pixels", [
    ("padded-mnist", 3, "unit"), ("mnist-noise", 30, "unit"), ("mnist", None, "unit"),
    ("mnist-noise", 30, "standardised")])
def test_device_batches_equal_host_batches(data_dir, name, T, pixels):
    with get_task(name, data_dir=data_dir, T=T, progress=False, pixels=pixels) as task:
        for split, kw in (("train", dict(seed=2, epoch=1, start=1)), ("test", {})):
            host = list(islice(task.batches(split, 7, **kw), 2))      # made one at a time:
            dev = list(islice(task.batches(split, 7, device="cuda", **kw), 2))   # two, not all
            for (xh, yh), (xd, yd) in zip(host, dev):
                assert memory.is_device_array(xd) and xd.dtype == np.float32
                np.testing.assert_array_equal(yd, yh)
                # the image part is copied; the noise agrees to a few float32 ulps (GPU FMAs)
                np.testing.assert_allclose(xd.copy_to_host(), xh, rtol=1e-6, atol=1e-6)
        with pytest.raises(ValueError, match="device must be one of cpu, cuda"):
            next(task.batches("test", 7, device="gpu"))


@pytest.mark.parametrize("name, T", [("mnist-noise", 30), ("mnist", None)])
def test_reused_buffers_give_the_same_batches_and_are_overwritten_two_batches_later(data_dir,
                                                                                    name, T):
    """reuse=True (what the training loop and evaluation use) yields the batches of reuse=False,
    a short last batch included, in buffers that come round again after two batches (the noise
    tasks: x, the image rows and the noise keys)."""
    with get_task(name, data_dir=data_dir, T=T, progress=False) as task:
        for split, kw in (("train", dict(seed=2, epoch=1, start=4)), ("test", {})):
            fresh = [(x.copy_to_host(), y) for x, y in task.batches(split, 7, device="cuda",
                                                                     **kw)]
            kept, seen = [], []
            for x, y in task.batches(split, 7, device="cuda", reuse=True, **kw):
                kept.append(x)
                seen.append((x.copy_to_host(), y))          # read before the next batch
            assert len(seen) == len(fresh) == (4 if split == "train" else 3)
            for (xa, ya), (xb, yb) in zip(seen, fresh):
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)
            # two buffers in turn: batch 0's array holds the last even batch now (in the test
            # split the short batch 2 over its first 6 rows), and batch 1's the last odd one
            last_even, last_odd = seen[0::2][-1][0], seen[1::2][-1][0]
            np.testing.assert_array_equal(kept[0].copy_to_host()[:len(last_even)], last_even)
            np.testing.assert_array_equal(kept[1].copy_to_host(), last_odd)
        with pytest.raises(ValueError, match="reuse=True reuses GPU buffers: it needs "
                                             "device='cuda', got 'cpu'"):
            next(task.batches("test", 7, reuse=True))
        with pytest.raises(ValueError, match="reuse must be True, False or an nprnn.core.memory.Staging"
                                             ", got 'yes'"):
            task.batches("test", 7, device="cuda", reuse="yes")


@pytest.mark.parametrize("name, T", [("mnist-noise", 30), ("mnist", None)])
def test_passes_that_share_a_staging_allocate_once(data_dir, name, T, monkeypatch):
    """A Staging handed to batches() (what train does for all its epochs and evaluations) gives
    the batches of fresh arrays, and once a pass at the largest batch size has filled its slots,
    later passes, smaller batches among them, allocate nothing."""
    allocated = []
    for kind in ("device_array", "pinned_array"):
        make = getattr(memory, kind)
        monkeypatch.setattr(memory, kind, lambda *a, _make=make, **kw: allocated.append(1)
                            or _make(*a, **kw))
    staging = memory.Staging()
    with get_task(name, data_dir=data_dir, T=T, progress=False) as task:
        # the train passes: the last 3 of an epoch's 15 batches (each batch is a few thousand
        # simulated GPU threads of noise)
        passes = [("test", 9, {}), ("train", 4, dict(seed=1, epoch=0, start=12)),
                  ("test", 9, {}), ("train", 4, dict(seed=1, epoch=1, start=12))]
        for k, (split, B, kw) in enumerate(passes):
            fresh = [(x.copy_to_host(), y) for x, y in task.batches(split, B, device="cuda",
                                                                     **kw)]
            before = len(allocated)
            shared = [(x.copy_to_host(), y) for x, y in task.batches(split, B, device="cuda",
                                                                      reuse=staging, **kw)]
            assert len(shared) == len(fresh)
            for (xa, ya), (xb, yb) in zip(shared, fresh):
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)
            if k > 0:
                assert len(allocated) == before, (k, split)


def test_staging_waits_for_a_slots_last_copy_before_rewriting_its_host_buffer(monkeypatch):
    """Staging.upload waits on the event recorded after a slot's previous copy (made `depth`
    uploads ago) before writing into that slot's page-locked buffer, and never otherwise."""
    log = []

    class Event:
        def __init__(self):
            self.id = len([e for e in log if e[0] == "new"])
            log.append(("new", self.id))

        def record(self, stream=0):
            log.append(("record", self.id))

        def synchronize(self):
            log.append(("wait", self.id))

    monkeypatch.setattr(memory, "_event", Event)
    staging = memory.Staging(depth=2)
    a, b, c = (np.full(4, v, np.int64) for v in (1, 2, 3))
    da = staging.upload("y", a)
    staging.upload("y", b)
    assert log == [("new", 0), ("record", 0), ("new", 1), ("record", 1)]
    dc = staging.upload("y", c)
    assert log[4:] == [("wait", 0), ("record", 0)]         # slot 0 again, after its copy ran
    np.testing.assert_array_equal(dc.copy_to_host(), c)
    np.testing.assert_array_equal(da.copy_to_host(), c)    # the same device buffer
    staging.upload("x", a)                                 # another name: slots of its own
    assert log[6:] == [("new", 2), ("record", 2)]
    big = np.arange(12, dtype=np.float64).reshape(3, 4)    # a larger array: the slot grows
    np.testing.assert_array_equal(staging.upload("y", big).copy_to_host(), big)
    np.testing.assert_array_equal(staging.upload("y", a[:3]).copy_to_host(), a[:3])
    assert staging.upload("y", a[:0]).shape == (0,)                   # nothing to copy
    assert staging.buffer("x", (2, 0, 3), np.float32).shape == (2, 0, 3)
    for depth in (0, 1.5, True):
        with pytest.raises(ValueError, match="depth must be an integer >= 1"):
            memory.Staging(depth)


@pytest.mark.real_gpu
@pytest.mark.skipif(simulator_enabled(), reason="the CUDA simulator runs each launch to its end "
                                                "before returning: nothing is left to overlap")
def test_an_upload_returns_while_the_kernels_queued_before_it_still_run():
    """On a GPU: Staging.upload does not wait for the GPU, and its copy still comes after the
    kernels queued before it. cuda.to_device, for contrast, waits for them."""
    from numba import cuda

    @cuda.jit
    def sleep(ms):
        for _ in range(ms):
            cuda.nanosleep(1000000)                      # about a millisecond

    a = np.arange(1000.0)
    staging = memory.Staging(depth=2)
    staging.upload("x", a), staging.upload("x", a)       # both slots' buffers allocated
    sleep[1, 1](0)                                       # compiled
    cuda.synchronize()
    done = cuda.event(timing=False)
    sleep[1, 1](500)
    done.record()
    d = staging.upload("x", a + 1)
    assert not done.query(), "the upload waited for the kernel queued before it"
    np.testing.assert_array_equal(d.copy_to_host(), a + 1)
    sleep[1, 1](500)
    done.record()
    cuda.to_device(a)
    assert done.query()


def test_to_device_passes_a_device_array_through_only_in_the_dtype_asked_for():
    a = memory.to_device(np.zeros(3))
    assert memory.to_device(a) is a and memory.to_device(a, np.float64) is a
    with pytest.raises(TypeError, match="a device array of dtype float64 where float32 is "
                                        "needed"):
        memory.to_device(a, np.float32)


def test_model_takes_device_batches(data_dir, monkeypatch):
    gt.small_launch(monkeypatch)
    with get_task("padded-mnist", data_dir=data_dir, T=3, progress=False) as task:
        xh, y = next(iter(task.batches("test", 2)))                 # the first batch alone
        xd, _ = next(iter(task.batches("test", 2, device="cuda")))
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
        model.loss_and_grad(memory.to_device(np.zeros((4, 3, 5), np.float32)), y)


def test_data_benchmark_on_cuda(monkeypatch, capsys):
    """benchmarks/bench_data.py --device cuda at tiny sizes: batches made on the device, the
    step on the device, and the GPU noise rate printed."""
    import runpy
    gt.small_launch(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["bench_data.py", "--device", "cuda", "--tasks", "",
                                      "--synthetic", "cifar10-noise", "--batch-size", "1",
                                      "--hidden", "3", "--batches", "1", "--steps", "1",
                                      "--T", "33"])
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks" / "bench_data.py"),
                   run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("device cuda, B=1")
    row = next(line.split() for line in out if line.startswith("cifar10-noise*"))
    assert row[1:3] == ["33", "96"] and row[-2] == "-" and row[-1].endswith("%")
    assert "nprnn.data.noise on the GPU" in out[-2]


def test_a_head_longer_than_the_sequence_is_refused_before_any_copy():
    """On a GPU an oversized head would be written past x unchecked (kernels do no bounds
    checks), so head_then_noise refuses it first."""
    with pytest.raises(ValueError, match="head's 5 steps do not fit in T = 4"):
        noise.head_then_noise_device(np.zeros((2, 5, 3), np.float32), 4, np.zeros((2, 2), np.int64))
