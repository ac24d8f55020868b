"""Files written so that a reader never sees half of one: a temporary beside the destination,
moved into place with os.replace once complete (checkpoints, caches, figures, downloads)."""
import os
import secrets
import socket
from contextlib import contextmanager
from pathlib import Path


def temporary_name(dest, kind):
    """A hidden name beside `dest` for a file that is still being written:
    .NAME.KIND-HOST-PID-RANDOM (downloads use kind "part", cache builds "tmp"). The host and the
    process id let `remove_stale_temporaries` tell a killed writer's file from a live one's."""
    return dest.with_name(f".{dest.name}.{kind}-{socket.gethostname()}-{os.getpid()}-"
                          f"{secrets.token_hex(4)}")


def pid_alive(pid):
    """Whether process `pid` of this host is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(directory, kind):
    """Delete the temporary files of `kind` in `directory` that a process of this host was writing
    when it was killed (its process is gone). Files of live processes and of other hosts (a shared
    data directory) are left alone. Returns the paths removed."""
    host, removed = socket.gethostname(), []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for tmp in directory.glob(f".*.{kind}-*"):
        try:
            rest = tmp.name.rsplit(f".{kind}-", 1)[1]
            tmp_host, pid, _ = rest.rsplit("-", 2)
            if tmp_host == host and not pid_alive(int(pid)):
                tmp.unlink()
                removed.append(tmp)
        except (ValueError, IndexError, OSError):
            continue
    return removed


@contextmanager
def written_atomically(path):
    """A temporary name beside `path` to write the new file to; when the block ends, the file is
    flushed to disk and moved over `path` with os.replace. So `path` holds either what it held
    before or the whole new file, never part of one (a `simulate` killed while writing its CSV
    left a truncated figure3.csv beside a complete figure3.json). On an exception the temporary
    is deleted and `path` is untouched; the temporary of a writer that was killed is deleted by
    the next write into its folder (`remove_stale_temporaries`). Checkpoints, caches, run
    configurations, figures and the autotuner's choices are all written through here."""
    path = Path(path)
    remove_stale_temporaries(path.parent, "tmp")
    tmp = temporary_name(path, "tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as f:          # the bytes reach the disk before the rename
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sync_folder(path.parent)


def _sync_folder(folder):
    """Make a rename in `folder` durable (where the system lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _nearest_existing(path):
    """`path` or its nearest ancestor that exists (a name the OS refuses, too long say, counts as
    not existing), or None."""
    for p in (path, *path.parents):
        try:
            if p.exists():
                return p
        except OSError:
            continue
    return None


def _not_a_folder(p):
    return f"{p} is {'a file' if p.is_file() else 'not a folder'}"


def why_no_folder(path, error):
    """Why mkdir of `path` failed: the nearest existing ancestor (or `path`) that is no folder,
    else the OS's reason ("Permission denied", "File name too long", ...)."""
    p = _nearest_existing(path)
    if p is not None and not p.is_dir():
        return _not_a_folder(p)
    return error.strerror or str(error)


def why_not_makeable(path):
    """Why the folder `path` could not be made or written to (its nearest existing ancestor is
    no folder, or not writable), or None if it is a folder or could be made."""
    p = _nearest_existing(path)
    if p is None:
        return None
    if not p.is_dir():
        return _not_a_folder(p)
    if p != path and not os.access(p, os.W_OK):
        return f"{p} is not writable"
    return None
