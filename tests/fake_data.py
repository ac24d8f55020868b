"""Small datasets written in the official file formats, and sources that point at them.

The tests write tiny MNIST-style IDX files and CIFAR-10 batches (python pickles, binary records,
tarballs) with known contents, then register a source whose MD5s are those files' MD5s, so every
code path of nprnn.data.sources / nprnn.data.datasets runs exactly as it does on the real files.
"""
import gzip
import hashlib
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np

from nprnn.data import sources

REPO = Path(__file__).resolve().parents[1]
REAL_MNIST = REPO.parent / "shared" / "data" / "mnist"      # ../shared/data/mnist (CI has it)


def md5(data):
    return hashlib.md5(data).hexdigest()


# ----------------------------------------------------------------------------------------------
# IDX
# ----------------------------------------------------------------------------------------------

def idx_bytes(array):
    """The IDX encoding of a uint8 array: 00 00 08 ndim, big-endian uint32 sizes, the bytes."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    return (bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            + array.tobytes())


def fake_mnist_arrays(n_train=60, n_test=20, seed=0):
    """Random 28 x 28 digits; labels cycle through 0..9 so every class is present."""
    rng = np.random.default_rng(seed)
    return dict(
        train_images=rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        train_labels=(np.arange(n_train) % 10).astype(np.uint8),
        test_images=rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        test_labels=((np.arange(n_test) * 3) % 10).astype(np.uint8))


MNIST_NAMES = dict(train_images="train-images-idx3-ubyte.gz",
                   train_labels="train-labels-idx1-ubyte.gz",
                   test_images="t10k-images-idx3-ubyte.gz",
                   test_labels="t10k-labels-idx1-ubyte.gz")


def write_fake_mnist(directory, arrays=None, gzipped=True):
    """Write the four IDX files (gzipped under their published names, or decompressed without
    .gz) into `directory`; returns the arrays written."""
    arrays = arrays or fake_mnist_arrays()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for role, name in MNIST_NAMES.items():
        data = idx_bytes(arrays[role])
        if gzipped:
            (directory / name).write_bytes(gzip.compress(data, mtime=0))
        else:
            (directory / name[:-3]).write_bytes(data)
    return arrays


def fake_idx_source(directory, name="mnist", urls=None, title="fake MNIST", arrays=None):
    """An IdxSource like sources.SOURCES['mnist'] whose published MD5s are those of the files
    write_fake_mnist(directory) writes (the arrays are re-encoded, so nothing needs to exist)."""
    arrays = arrays or fake_mnist_arrays()
    files = {}
    for role, fname in MNIST_NAMES.items():
        data = idx_bytes(arrays[role])
        files[role] = sources.RemoteFile(fname, md5(gzip.compress(data, mtime=0)),
                                         tuple(u + fname for u in (urls or ["http://0.0.0.0/"])),
                                         md5(data))
    return sources.IdxSource(name=name, title=title, subdir=name, files=files,
                             homepage="http://example.invalid/")


def register_fake_mnist(data_dir, arrays=None):
    """Register the source of the fake MNIST that write_fake_mnist(data_dir / "mnist") writes as
    SOURCES['mnist'] (for subprocesses, which cannot use pytest's monkeypatch)."""
    sources.SOURCES["mnist"] = fake_idx_source(data_dir, arrays=arrays)


# ----------------------------------------------------------------------------------------------
# CIFAR-10
# ----------------------------------------------------------------------------------------------

def fake_cifar_arrays(per_batch=4, seed=0):
    """Five training batches and one test batch of random 32 x 32 RGB images, channels last."""
    rng = np.random.default_rng(seed)
    batches = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        images = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
        labels = ((np.arange(per_batch) + i) % 10).astype(np.uint8)
        batches[name] = (images, labels)
    return batches


def planar_rows(images):
    """(N, 32, 32, 3) -> (N, 3072): the official row, 1024 red, 1024 green, 1024 blue values."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), 3072))


def cifar_pickle_bytes(images, labels, name="data_batch_1"):
    """A batch as the python version stores it: a protocol-2 pickle of a dict with bytes keys."""
    batch = {b"batch_label": f"fake {name}".encode(), b"labels": [int(v) for v in labels],
             b"data": planar_rows(images),
             b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))]}
    return pickle.dumps(batch, protocol=2)


def cifar_binary_bytes(images, labels):
    """A batch as the binary version stores it: records of label byte + 3072 pixel bytes."""
    return np.concatenate([labels[:, None].astype(np.uint8), planar_rows(images)], 1).tobytes()


def cifar_member_bytes(batches, kind):
    """{member file name: bytes} of the python or binary version."""
    if kind == "python":
        return {name: cifar_pickle_bytes(im, lb, name) for name, (im, lb) in batches.items()}
    return {name + ".bin": cifar_binary_bytes(im, lb) for name, (im, lb) in batches.items()}


CIFAR_DIRS = dict(python="cifar-10-batches-py", binary="cifar-10-batches-bin")
CIFAR_TARBALLS = dict(python="cifar-10-python.tar.gz", binary="cifar-10-binary.tar.gz")


def tarball_bytes(members, directory):
    """A .tar.gz of the members under `directory`, the same bytes at every call: member mtimes
    and the gzip header's time are 0 (tarfile's "w:gz" would stamp the current second into the
    header, so two calls a second apart gave different MD5s)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"{directory}/{name}")
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0)


def write_fake_cifar(directory, kind, form, batches=None):
    """Write one CIFAR-10 version (kind 'python' or 'binary') into `directory`, as a tarball
    (form 'tar') or extracted (form 'dir'). Returns the path written."""
    batches = batches or fake_cifar_arrays()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    members = cifar_member_bytes(batches, kind)
    if form == "tar":
        path = directory / CIFAR_TARBALLS[kind]
        path.write_bytes(tarball_bytes(members, CIFAR_DIRS[kind]))
        return path
    path = directory / CIFAR_DIRS[kind]
    path.mkdir(exist_ok=True)
    for name, data in members.items():
        (path / name).write_bytes(data)
    return path


def fake_cifar_source(batches=None, urls=None):
    """A CifarSource like sources.SOURCES['cifar10'] whose published MD5s (tarballs, python
    members) are those of the files write_fake_cifar writes."""
    batches = batches or fake_cifar_arrays()
    real = sources.SOURCES["cifar10"]
    versions = []
    for kind in ("python", "binary"):
        members = cifar_member_bytes(batches, kind)
        tar = tarball_bytes(members, CIFAR_DIRS[kind])
        remote = sources.RemoteFile(CIFAR_TARBALLS[kind], md5(tar),
                                    tuple(u + CIFAR_TARBALLS[kind]
                                          for u in (urls or ["http://0.0.0.0/"])))
        versions.append(sources.CifarVersion(
            remote, CIFAR_DIRS[kind],
            {n: (md5(d) if kind == "python" else None) for n, d in members.items()}, kind,
            batch_records=len(batches["test_batch"][1])))
    return sources.CifarSource(name="cifar10", title="fake CIFAR-10", subdir="cifar-10",
                               versions=tuple(versions), homepage="http://example.invalid/",
                               train_members=real.train_members, test_members=real.test_members)


def cifar_expected(batches=None):
    """(train images, train labels, test images, test labels) the loaders must return."""
    batches = batches or fake_cifar_arrays()
    train = [batches[f"data_batch_{k}"] for k in range(1, 6)]
    return (np.concatenate([im for im, _ in train]), np.concatenate([lb for _, lb in train]),
            *batches["test_batch"])
