"""A run folder's files and guards, apart from the loop that fills them: the errors a run raises,
metrics.jsonl (`MetricsLog`) and its TensorBoard mirror, the stop signals (`StopSignals`), and the
lock that keeps a second process out (`RunLock`). nprnn/runs/train.py says what each file holds.
"""
import fcntl
import json
import math
import os
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np

from ..util.files import written_atomically
from ..core.memory import to_host

METRICS = "metrics.jsonl"
CONFIG = "config.json"
BEST = "best.h5"
LOCK = ".lock"


class TrainError(Exception):
    """A run that cannot start or continue as asked (bad options, folder already used, ...)."""


class TrainingDiverged(TrainError):
    """The loss or the gradient became NaN or Inf."""


class RunInUse(TrainError):
    """Another process is training in the run folder (it holds the folder's lock)."""


# ----------------------------------------------------------------------------------------------
# The run folder: metrics log and signals
# ----------------------------------------------------------------------------------------------

class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl, flushed at once.

    A resumed run's log continues exactly where its checkpoint stands. Each checkpoint records
    the log's length (`length()`), and opened with `keep_bytes=n` the log is cut back to those n
    bytes: what follows was logged after the checkpoint, by steps and evaluations that the
    resumed run does again (an evaluation at the checkpoint's own iteration among them, when the
    process died while saving after it). A checkpoint written before there was such a length
    gives `keep_until=i` instead: the lines of iterations after i are dropped, and a torn last
    line."""

    def __init__(self, path, keep_until=None, keep_bytes=None, tensorboard=None):
        self.path, self.tensorboard = Path(path), tensorboard
        if keep_bytes is not None and self.path.exists():
            if self.path.stat().st_size > keep_bytes:
                os.truncate(self.path, keep_bytes)
        elif keep_until is not None and self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and rec.get("iteration", 0) <= keep_until:
                    kept.append(line)
            with written_atomically(self.path) as tmp:
                tmp.write_text("".join(line + "\n" for line in kept))
        self.file = open(self.path, "a")

    def write(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def length(self):
        """The log's length in bytes, once what was written is on disk (a checkpoint that
        records it must not get there first)."""
        try:
            os.fsync(self.file.fileno())
        except OSError:                 # not a regular file (/dev/null, a pipe): nothing to sync
            pass
        return os.fstat(self.file.fileno()).st_size

    def close(self):
        self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


class TensorBoardLog:
    """metrics.jsonl's records mirrored as TensorBoard scalars (split/loss, split/accuracy,
    train/grad_norm, train/lr) in the run folder, so that runs, seeds and a sweep's trials open
    side by side (`tensorboard --logdir runs`); for the Euler cells, at each logging interval,
    histograms of the recurrent matrix's eigenvalues (real parts and moduli: an n x n eigvals,
    cheap beside an interval of steps). tensorboardX writes the event files (the tensorboard
    extra); metrics.jsonl stays the record."""

    SCALARS = ("loss", "accuracy", "grad_norm", "lr")

    def __init__(self, out, model):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise TrainError("--tensorboard needs the tensorboard extra: pip install -e "
                             "'.[tensorboard]'") from None
        self.writer, self.model = SummaryWriter(logdir=str(out)), model

    def write(self, record):
        it, split = record["iteration"], record["split"]
        for key in self.SCALARS:
            if record.get(key) is not None and math.isfinite(record[key]):
                self.writer.add_scalar(f"{split}/{key}", record[key], it)
        if split == "train" and hasattr(self.model.cell, "matrix"):
            W = to_host(self.model.params["W"]).astype(np.float64)
            A = self.model.cell.matrix(W, self.model.hyper.get("gamma", 0.0))
            eigenvalues = np.linalg.eigvals(A)
            self.writer.add_histogram("recurrent_eigenvalues/real", eigenvalues.real, it)
            self.writer.add_histogram("recurrent_eigenvalues/modulus", np.abs(eigenvalues), it)
        self.writer.flush()

    def close(self):
        self.writer.close()


class SecondSignal(KeyboardInterrupt):
    """A second SIGINT or SIGTERM while a run was finishing its step: abort at once. `name` is
    the signal's ("SIGINT", "SIGTERM")."""

    def __init__(self, name):
        super().__init__(f"second {name}: aborted")
        self.name = name


class StopSignals:
    """While active, SIGINT and SIGTERM only set `requested` (the signal's name): the loop finishes
    its step, checkpoints, and returns. A second signal aborts at once (KeyboardInterrupt), which
    is still safe: checkpoints are atomic. Signal handlers exist only in the main thread; in any
    other thread this does nothing.

    The handler writes nothing: it runs between two bytecodes of the main thread, perhaps inside
    a write to the very stream it would print on, and a buffered stream refuses such a nested
    write ("RuntimeError: reentrant call"). The loop asks `stopping()` instead, whose first answer
    after a signal says what will happen."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, echo, asked=None):
        self.echo = echo
        self.asked = asked                 # a callable: why to stop (a few words), or None
        self.requested = None
        self.announced = False
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.requested is not None:
            raise SecondSignal(signal.Signals(signum).name)
        self.requested = signal.Signals(signum).name

    def stopping(self):
        """The name of the signal that asked to stop (or what `asked` said), or None."""
        if self.requested is None and self.asked is not None:
            self.requested = self.asked()
            if self.requested is not None:
                self.announced = True
                self.echo(f"stop asked ({self.requested}): writing a checkpoint")
        if self.requested is not None and not self.announced:
            self.announced = True
            self.echo(f"{self.requested} received: finishing this step, then writing a "
                      f"checkpoint (send it again to abort at once)")
        return self.requested

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        return False


class RunLock:
    """An exclusive OS lock (flock) on the run folder's .lock file for the life of a training
    process: the system releases it when the process ends, by a crash or kill -9 too, so a lock
    is never stale. The file says which process holds it; a second process is refused, named."""

    def __init__(self, out):
        self.out, self.path, self.file = out, out / LOCK, None

    def __enter__(self):
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a+")
        except OSError as e:
            raise TrainError(f"cannot create the run folder {self.out}: "
                             f"{e.strerror or e}") from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise RunInUse(f"{self.out} is in use: {holder} is training there. Wait for it "
                             f"to end, or choose another --out") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"process {os.getpid()} on {socket.gethostname()} since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self.file.flush()
        return self

    def __exit__(self, *exc):
        self.file.close()                      # closing releases the lock


def write_json(path, obj):
    with written_atomically(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def last_record(metrics_path, split, iteration):
    """The last metrics.jsonl record of `split` at `iteration`, or None."""
    found = None
    with open(metrics_path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("split") == split and rec.get("iteration") == iteration:
                found = rec
    return found
