"""The cache
---------
The first use of a task builds data_dir/<task>.h5 (pmnist with a seed other than 0:
pmnist-seed<seed>.h5) from the raw files (`nprnn.data.sources`):

    /train/images  uint8 (N, H, W, C)    /train/labels  uint8 (N,)
    /test/images   uint8 (M, H, W, C)    /test/labels   uint8 (M,)
    /permutation   int64 (H W,)          pmnist only
    each dataset's attribute crc32: the CRC-32 of its bytes
    file attributes: format_version, task, layout, source, origin, raw_files (JSON: path, MD5 and
    check of every raw file; size and mtime_ns of one no published MD5 pins), normalisation,
    pixel_mean / pixel_std (per channel, of x = p / 255 over the training file; what
    pixels="standardised" applies), permutation_seed, created, nprnn_version

It is written to a temporary file and renamed into place, so it either exists whole or not at all,
and two processes building it at once each rename a complete file. Opening checks the format
version, the task, the shapes, the labels and every dataset's CRC-32 (~0.1 s for MNIST), and
that no raw file checked by structure alone (extracted CIFAR-10 binary batches have no published
MD5s) has changed size or modification time since; a cache that fails any check is rebuilt with a
message, never used. (Raw files that published MD5s pin cannot change unnoticed: a rebuild checks
them. A raw file deleted after the build leaves its cache in use.) Batches read only their own
images from the file, so memory stays at a few batches (the labels, int64, are held in memory).
"""
import datetime
import json
import sys
import zlib
from pathlib import Path

import h5py
import numpy as np

from . import sources, synthetic
from ..util.files import written_atomically
from .tasks import (DEFAULT_PERMUTATION_SEED, NORMALISATION, cache_path, resolve_data_dir,
                    splitmix64_permutation, task_spec)

# ----------------------------------------------------------------------------------------------
# the HDF5 cache
# ----------------------------------------------------------------------------------------------

CACHE_FORMAT_VERSION = 1


def _say(message):
    print(message, file=sys.stderr, flush=True)


def _crc32(dataset, block_bytes=1 << 24):
    """CRC-32 of a dataset's bytes (C order), read a block of rows at a time."""
    rows = max(1, block_bytes // max(1, dataset[0:1].nbytes if dataset.shape[0] else 1))
    crc = 0
    for start in range(0, dataset.shape[0], rows):
        crc = zlib.crc32(np.ascontiguousarray(dataset[start:start + rows]).tobytes(), crc)
    return crc


def _pixel_stats(images, rows=2048):
    """Per-channel mean and standard deviation of x = pixel / 255 over uint8 (N, H, W, C), from
    each channel's histogram of the 256 byte values (exact; a block of rows at a time, because
    bincount widens its input to int64)."""
    C = images.shape[-1]
    values = np.arange(256) / 255.0
    mean, std = np.zeros(C), np.zeros(C)
    for c in range(C):
        counts = sum(np.bincount(images[s:s + rows, ..., c].ravel(), minlength=256)
                     for s in range(0, len(images), rows))
        p = counts / max(counts.sum(), 1)
        mean[c] = p @ values
        std[c] = np.sqrt(max(p @ (values - mean[c]) ** 2, 0.0))
    return mean, std


def _write_split(f, split, images, labels):
    """/<split>/images and /<split>/labels, contiguous (a batch reads its rows directly)."""
    for key, data in (("images", images), ("labels", labels)):
        ds = f.create_dataset(f"{split}/{key}", data=data)
        ds.attrs["crc32"] = zlib.crc32(np.ascontiguousarray(data).tobytes())


def build_cache(name, data_dir=None, seed=DEFAULT_PERMUTATION_SEED, download=True, progress=True,
                T=None):
    """Read the task's raw files (a synthetic task: draw its fixed sets at its T) and write its
    cache atomically; returns the cache's Path.

    The file is written under a temporary name in the same directory, flushed to disk and renamed
    over the cache path: readers see the old file, or no file, or the complete new one."""
    spec = task_spec(name)
    if spec.synthetic:
        return _build_synthetic(spec, cache_path(name, data_dir, seed, T), T)
    source = sources.SOURCES[spec.source]
    data_dir = resolve_data_dir(data_dir)
    path = cache_path(name, data_dir, seed)
    raw = source.load(data_dir, download=download, progress=progress)
    H, W, C = source.image_shape
    for split in ("train", "test"):
        images, labels = getattr(raw, f"{split}_images"), getattr(raw, f"{split}_labels")
        if images.shape[1:] != (H, W, C) or images.dtype != np.uint8 or len(images) != len(labels):
            raise sources.RawFormatError(f"{source.title}: {split} images must be uint8 (N, {H}, "
                                         f"{W}, {C}) with N labels; got {images.dtype} "
                                         f"{images.shape} and {len(labels)} labels")
    path.parent.mkdir(parents=True, exist_ok=True)
    _say(f"building {path} from {raw.origin}")
    with written_atomically(path) as tmp:
        with h5py.File(tmp, "w") as f:
            _write_split(f, "train", raw.train_images, raw.train_labels)
            _write_split(f, "test", raw.test_images, raw.test_labels)
            if spec.layout == "permuted":
                perm = splitmix64_permutation(H * W, seed)
                ds = f.create_dataset("permutation", data=perm)
                ds.attrs["crc32"] = zlib.crc32(perm.tobytes())
                f.attrs["permutation_seed"] = seed
            mean, std = _pixel_stats(raw.train_images)
            f.attrs.update(dict(
                format_version=CACHE_FORMAT_VERSION, task=spec.name, layout=spec.layout,
                source=spec.source, origin=raw.origin, raw_files=json.dumps(raw.files),
                normalisation=NORMALISATION, pixel_mean=mean, pixel_std=std,
                num_classes=source.num_classes,
                created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                nprnn_version=_version()))
    return path


def _version():
    try:
        from importlib.metadata import version
        return version("nprnn")
    except Exception:              # not installed (a source checkout on sys.path)
        return "unknown"


# attributes that describe the cache (`info`), beside the ones check_cache compares with the task
_DESCRIPTIVE_ATTRS = ("source", "origin", "raw_files", "normalisation", "pixel_mean", "pixel_std",
                      "created", "nprnn_version")


def check_cache(path, name, seed=DEFAULT_PERMUTATION_SEED, T=None):
    """None if the cache at `path` is a complete, current cache of task `name` (a synthetic
    task's: at its T); else the reason.

    Checks: readable HDF5, format version, task, layout and number of classes, the presence of the
    descriptive attributes, datasets and their shapes and dtypes, label range, permutation (pmnist),
    the CRC-32 of every dataset's bytes, and the raw files checked by structure only (unchanged
    size and modification time, where they still are)."""
    spec = task_spec(name)
    if spec.synthetic:
        return _check_synthetic(path, spec, T)
    source = sources.SOURCES[spec.source]
    path = Path(path)
    try:
        if not path.exists() or path.is_dir():
            return _not_a_file(path)
        with h5py.File(path, "r") as f:
            wrong = _wrong_header(f, task=spec.name, layout=spec.layout,
                                  num_classes=source.num_classes)
            if wrong:
                return wrong
            missing = [key for key in _DESCRIPTIVE_ATTRS if key not in f.attrs]
            if missing:
                return f"its attribute(s) {', '.join(missing)} are missing"
            changed = _changed_raw_file(json.loads(f.attrs["raw_files"]))
            if changed:
                return changed
            names = ["train/images", "train/labels", "test/images", "test/labels"]
            if spec.layout == "permuted":
                names.append("permutation")
                if f.attrs.get("permutation_seed") != seed:
                    return (f"its permutation seed is {f.attrs.get('permutation_seed')}, "
                            f"expected {seed}")
            for key in names:
                if key not in f:
                    return f"dataset /{key} is missing"
            for split in ("train", "test"):
                images, labels = f[f"{split}/images"], f[f"{split}/labels"]
                if (images.dtype != np.uint8 or images.shape[1:] != source.image_shape
                        or labels.dtype != np.uint8 or labels.shape != (images.shape[0],)):
                    return (f"/{split} has images {images.dtype} {images.shape} and labels "
                            f"{labels.dtype} {labels.shape}; expected uint8 (N, "
                            f"{', '.join(map(str, source.image_shape))}) and uint8 (N,)")
            for key in names:
                if _crc32(f[key]) != f[key].attrs.get("crc32"):
                    return f"the contents of /{key} do not match their stored CRC-32 (corrupt)"
            for split in ("train", "test"):
                labels = f[f"{split}/labels"][:]
                if len(labels) and labels.max() >= source.num_classes:
                    return f"/{split}/labels holds label {labels.max()} >= {source.num_classes}"
            if spec.layout == "permuted":
                H, W, _ = source.image_shape
                perm = f["permutation"][:]
                if not np.array_equal(np.sort(perm), np.arange(H * W)):
                    return "/permutation is not a permutation"
    except PermissionError as e:
        return f"it cannot be read ({e})"
    except Exception as e:         # h5py raises OSError, KeyError, RuntimeError on damaged files
        return f"it cannot be read ({type(e).__name__}: {e}): truncated or corrupt"
    return None


def _changed_raw_file(records):
    """The reason to rebuild if a raw file that was checked by structure alone (a record with
    size and mtime_ns) is still where it was but has another size or modification time; else
    None. (A damaged raw_files value raises, and the cache counts as corrupt.)"""
    for r in records:
        if "size" not in r:
            continue
        try:
            st = Path(r["path"]).stat()
        except OSError:
            continue                   # deleted after the build (or out of reach): the cache is
                                       # what is left
        if (st.st_size, st.st_mtime_ns) != (r["size"], r["mtime_ns"]):
            return (f"its raw file {r['path']} has changed since the cache was built (no "
                    f"published MD5 pins that file: its size and modification time are checked)")
    return None


def cache_state(name, data_dir=None, seed=DEFAULT_PERMUTATION_SEED, T=None):
    """Where a task's cache is and whether it is usable, without building anything."""
    path = cache_path(name, data_dir, seed, T)
    reason = check_cache(path, name, seed, T)
    exists, size = True, 0
    try:
        size = path.stat().st_size
    except (FileNotFoundError, NotADirectoryError):
        exists = False
    except OSError:                # a folder on its path cannot be looked into: `problem` says so
        pass
    return dict(path=str(path), exists=exists, usable=reason is None, problem=reason, bytes=size)


# ----------------------------------------------------------------------------------------------
# the cache of a synthetic task: its fixed valid and test sets
# ----------------------------------------------------------------------------------------------

SYNTHETIC_SPLITS = ("valid", "test")


def synthetic_datasets(spec, T):
    """{name: (dtype, shape of a row)} of a split of a synthetic task's cache."""
    if spec.layout == "copy":
        return dict(symbols=(np.uint8, (synthetic.COPY_SYMBOLS,)))
    found = dict(values=(np.float32, (T,)), markers=(np.int64, (2,)))
    if spec.varlen:
        found["lengths"] = (np.int64, ())
    return found


def _build_synthetic(spec, path, T):
    """Draw the valid and test sets of `spec` at T and write them to `path` atomically."""
    T = spec.check_T(T)
    path.parent.mkdir(parents=True, exist_ok=True)
    _say(f"building {path}: the {spec.name} task's valid and test sets at T = {T}")
    with written_atomically(path) as tmp:
        with h5py.File(tmp, "w") as f:
            for split in SYNTHETIC_SPLITS:
                rows = np.arange(synthetic.EVAL_SIZE)
                drawn = synthetic.draw(spec, T, synthetic.scored_keys(spec, T, split, rows))
                for key, data in drawn.items():
                    ds = f.create_dataset(f"{split}/{key}", data=data)
                    ds.attrs["crc32"] = zlib.crc32(np.ascontiguousarray(data).tobytes())
            f.attrs.update(dict(
                format_version=CACHE_FORMAT_VERSION, task=spec.name, layout=spec.layout, T=T,
                rows=synthetic.EVAL_SIZE, generator="nprnn.data.synthetic.draw",
                created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                nprnn_version=_version()))
    return path


def _not_a_file(path):
    """Why a cache path that is not a file cannot be read."""
    return "it is a directory, not a file" if path.is_dir() else "it does not exist"


def _wrong_header(f, **want):
    """What is wrong with an open cache's header, or None: its format version, then each
    attribute named in `want` against its expected value."""
    version = f.attrs.get("format_version")
    if version != CACHE_FORMAT_VERSION:
        return (f"it has format version {version}, this nprnn writes version "
                f"{CACHE_FORMAT_VERSION}")
    for key, value in want.items():
        got = f.attrs.get(key)
        if got != value:
            got = got.item() if isinstance(got, np.generic) else got
            return f"its {key} is {got!r}, expected {value!r}"
    return None


def _check_synthetic(path, spec, T):
    """check_cache for a synthetic task at T: format, task, layout, T, the datasets, their
    shapes, dtypes and CRC-32, and the rows against the task's definition."""
    T = spec.check_T(T)
    path = Path(path)
    try:
        if not path.exists() or path.is_dir():
            return _not_a_file(path)
        with h5py.File(path, "r") as f:
            wrong = _wrong_header(f, task=spec.name, layout=spec.layout, T=T)
            if wrong:
                return wrong
            for split in SYNTHETIC_SPLITS:
                for key, (dtype, row) in synthetic_datasets(spec, T).items():
                    name = f"{split}/{key}"
                    if name not in f:
                        return f"dataset /{name} is missing"
                    ds = f[name]
                    if ds.dtype != dtype or ds.shape[1:] != row or len(ds) != synthetic.EVAL_SIZE:
                        return (f"/{name} is {ds.dtype} {ds.shape}, expected "
                                f"{np.dtype(dtype)} {(synthetic.EVAL_SIZE,) + row}")
                    if _crc32(ds) != ds.attrs.get("crc32"):
                        return f"the contents of /{name} do not match their stored CRC-32 (corrupt)"
                problem = synthetic.check_drawn(spec, T, {k: v[:] for k, v in f[split].items()})
                if problem:
                    return f"/{split} {problem}"
    except PermissionError as e:
        return f"it cannot be read ({e})"
    except Exception as e:         # h5py raises OSError, KeyError, RuntimeError on damaged files
        return f"it cannot be read ({type(e).__name__}: {e}): truncated or corrupt"
    return None


def read_synthetic(path, spec, T):
    """{split: drawn rows (synthetic.draw's dict)} of the valid and test sets in a checked cache."""
    with h5py.File(path, "r") as f:
        return {split: {k: f[f"{split}/{k}"][:] for k in synthetic_datasets(spec, T)}
                for split in SYNTHETIC_SPLITS}
