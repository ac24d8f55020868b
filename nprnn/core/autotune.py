"""Timing the GPU kernels: the autotuner that chooses which kernels a model runs on this GPU,
and the benchmark's rows (`cli.py bench --device cuda`).

Where several kernels can run a pass (the step and the persistent versions; for the Euler cells'
persistent kernels the matrix read from global memory or kept in shared memory; for them and rnn
the split kernels with 2 to 16 lanes per unit: `backends.options`), which is fastest depends on
the GPU, n, the batch size and the dtype. So, as cuDNN's find and Triton's autotune do, a
`Tuner` times every option of each pass once per (cell, n, B, T, dtype, GPU), on the run's own
T steps of random data (at most TUNE_STEPS: at T = 64 a pass took about 0.1 ms, near a launch's
cost, and close options were picked by noise), keeps the fastest, and writes the choice to a
small JSON file (`cache_path`: beside numba's cache when NUMBA_CACHE_DIR is set, else
~/.cache/nprnn), so that later runs on the same GPU start with it. The file also holds a digest
of the kernel sources: when they change, every choice is timed again. Processes that share the
file (a sweep's workers) time one at a time, under a lock on it (POSIX), and one that waited
takes what the other timed: two timings never share the GPU.

    tuner = Tuner.for_this_gpu()
    choice = tuner.choose(model, B, T)     # Choice(forward=Kernels, backward=Kernels, how=...)

Untimed (the CUDA simulator, whose timings mean nothing, or a Tuner without `measure`), a pass
runs its first option: the persistent kernels with the matrix in global memory where they fit,
as an NVIDIA H100 showed fastest (docs/gpu.md). Tests pass a fake `measure`.
"""
import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .backends import CUDA, options, time_major
from ..util.files import written_atomically
from ..kernels.gpu_common import cuda, simulator_enabled
from .memory import DeviceWorkspace, device_copy

CACHE_NAME = "kernel-choices.json"
FORMAT = 2              # 2: T joined the key
TUNE_STEPS = 1024        # at most this many time steps in a timing run (the run's T below it)


def cache_path():
    """Where the kernel choices are kept: $NPRNN_CACHE_DIR, else $NUMBA_CACHE_DIR (beside numba's
    compiled kernels), else $XDG_CACHE_HOME/nprnn or ~/.cache/nprnn; the file CACHE_NAME."""
    for var in ("NPRNN_CACHE_DIR", "NUMBA_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var]) / CACHE_NAME
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nprnn" / CACHE_NAME


def kernels_digest():
    """A digest of the kernels and of the code that calls them (backends.py, cells.py): a choice
    timed on other kernels is stale."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    callers = [here / "backends.py", here / "cells.py"]
    kernels = sorted((here.parent / "kernels").rglob("*.py"))
    assert kernels, "no kernels found beside nprnn/core/"
    for path in kernels + callers:
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def device_name():
    """The current GPU's name and compute capability, e.g. 'NVIDIA H100 80GB HBM3 (sm_90)'."""
    if simulator_enabled():
        return "numba's CUDA simulator (no timings)"
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    major, minor = dev.compute_capability
    return f"{name} (sm_{major}{minor})"


def elapsed_ms(fn, repeats=5, warmup=1):
    """Median over `repeats` runs of fn's GPU time in milliseconds, measured with CUDA events
    around each run (after `warmup` untimed runs, which also compile the kernels)."""
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = cuda.event(), cuda.event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def measure_ms(run, kernels, backward):
    """A Tuner's `measure` on a real GPU: run's median time in ms (kernels and backward say what
    runs, for a fake measure in tests)."""
    return elapsed_ms(run, repeats=5, warmup=1)


@dataclass(frozen=True)
class Choice:
    """The kernels of a model's forward and backward passes, and how they were chosen: "timed"
    (just now), "cached" (timed earlier on this GPU) or "untimed" (the first option)."""
    forward: object             # a backends.Kernels
    backward: object
    how: str

    def __str__(self):
        if self.forward == self.backward:
            what = f"{self.forward} (forward and BPTT)"
        else:
            what = f"forward {self.forward}; BPTT {self.backward}"
        return f"{what}, {self.how}"


class Tuner:
    """Chooses a model's kernels on this GPU (module docstring). `path`: the JSON file of
    choices (None: kept in memory only); `measure(run, kernels, backward)`: the milliseconds one
    call of `run` takes (None: nothing is timed, the first option runs)."""

    def __init__(self, path=None, measure=None, steps=TUNE_STEPS, gpu=None):
        self.path = None if path is None else Path(path)
        self.measure, self.steps = measure, steps
        self.gpu = gpu                             # the GPU's name (None: asked on first use)
        self._choices = None                       # key -> entry, read from path on first use
        self._chosen = {}                          # what choose() answered, for every later step

    @classmethod
    def for_this_gpu(cls):
        """The Tuner a model gets: timing with CUDA events into cache_path() on a GPU; under the
        simulator, untimed."""
        if simulator_enabled():
            return cls()
        return cls(cache_path(), measure_ms)

    def choose(self, model, B, T, version="auto"):
        """The Choice for `model` (on cuda) on batches of B rows and T steps: for `version`
        "auto" the fastest options (timed now, or earlier), else the options `version` names
        ("step", "persistent" or a gpu.Kernels)."""
        asked = (model.name, model.hidden_size, B, min(T, self.steps), model.dtype.name, version)
        if asked not in self._chosen:
            self._chosen[asked] = self._choose(model, B, T, version)
        return self._chosen[asked]

    def _choose(self, model, B, T, version):
        cell, n, dtype, launch = model.cell, model.hidden_size, model.dtype, model.launch
        if version != "auto":
            asked = CUDA.for_cell(cell, n, dtype, version, launch)
            return Choice(asked.forward, asked.backward, "asked for")
        fits = [options(cell, n, dtype, backward, launch) for backward in (False, True)]
        if self.measure is None:
            return Choice(fits[0][0], fits[1][0], "untimed")
        T = max(1, min(T, self.steps))             # the steps a timing runs, and the key's T
        key = self._key(model, B, T)
        for fresh in (False, True):                # the second look: after the lock, reread
            with self._locked() if fresh else contextlib.nullcontext():
                choices = self._load(fresh)
                if key in choices:
                    picked = _picked(fits, choices[key])
                    if None not in picked:
                        return Choice(*picked, "cached")
                if fresh:
                    choices[key] = self._time(model, fits, B, T)
                    self._save()
        return Choice(*_picked(fits, choices[key]), "timed")

    def _key(self, model, B, T):
        if self.gpu is None:
            self.gpu = device_name()
        return (f"{self.gpu} | {model.name} | n={model.hidden_size} | B={B} | T={T} | "
                f"{model.dtype.name}")

    @contextlib.contextmanager
    def _locked(self):
        """Hold an exclusive lock on the choices' file (on `path` + ".lock"), so that no other
        process times while this one does; where it cannot be taken (no file, no POSIX locks,
        a folder that cannot be written), go on without it."""
        try:
            import fcntl
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_name(self.path.name + ".lock"), "a")
        except (ImportError, AttributeError, OSError):
            yield
            return
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _time(self, model, fits, B, T):
        """Each option of the forward pass, then each of BPTT after the fastest forward: an entry
        {"forward": token, "backward": token, "forward_ms": {...}, "backward_ms": {...}}."""
        m, n, dtype, cell = model.input_size, model.hidden_size, model.dtype, model.cell
        rng = np.random.default_rng(0)
        x = device_copy(rng.standard_normal((T, B, m)).astype(dtype))
        dh_T = device_copy(rng.standard_normal((B, n)).astype(dtype))
        p, hyper = model.cell_params(), model.hyper
        ws, out = DeviceWorkspace(), DeviceWorkspace()

        def on(forward, backward=None):
            return CUDA(model.launch, forward, backward or forward)
        entry = {"T": T}
        forward_ms = {k.token: self.measure(
            lambda k=k: cell.forward(p, x, None, ws, backend=on(k), **hyper), k, False)
            for k in fits[0]}
        fastest = _fastest(fits[0], forward_ms)
        _, cache = cell.forward(p, x, None, ws, backend=on(fastest), **hyper)
        backward_ms = {k.token: self.measure(
            lambda k=k: cell.backward(p, cache, dh_T, ws, out, backend=on(fastest, k), **hyper),
            k, True) for k in fits[1]}
        entry.update(forward=fastest.token, backward=_fastest(fits[1], backward_ms).token,
                     forward_ms=forward_ms, backward_ms=backward_ms)
        return entry

    def _load(self, fresh=False):
        """The choices: the file's, read on first use and again when `fresh` (what another
        process wrote since; those kept in memory only stay)."""
        if self._choices is None or fresh:
            self._choices = dict(self._choices or {})
            if self.path is not None:
                try:
                    saved = json.loads(self.path.read_text())
                    if saved.get("format") == FORMAT and saved.get("kernels") == kernels_digest():
                        self._choices.update(saved["choices"])
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    pass        # missing, unreadable or of other kernels: timed afresh
        return self._choices

    def _save(self):
        """Write the choices; a folder that cannot be written leaves them in memory only."""
        if self.path is None:
            return
        data = dict(format=FORMAT, kernels=kernels_digest(), choices=self._choices)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with written_atomically(self.path) as tmp:
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass


class Fixed:
    """A tuner that answers one Choice whatever it is asked (what another model chose): the
    training loop's throwaway model compiles the kernels of the run's own this way."""

    def __init__(self, choice):
        self.choice = choice

    def choose(self, model, B, T, version="auto"):
        return self.choice


def _picked(fits, entry):
    """The Kernels of each pass that a cache entry names (None where no option fits the name:
    a file of other kernels, or damaged)."""
    return [next((k for k in opts if k.token == entry.get(pass_)), None)
            for opts, pass_ in zip(fits, ("forward", "backward"))]


def _fastest(options, ms):
    """The option of least time; ties (and NaN) go to the earlier, preferred one."""
    best = options[0]
    for k in options[1:]:
        if ms[k.token] < ms[best.token]:
            best = k
    return best


# ------------------------------------------------------------------------------------------
# The benchmark's rows
# ------------------------------------------------------------------------------------------

def time_model(model, x, y, versions=("step", "persistent", "split"), repeats=5, warmup=1):
    """Time every kernel option of `model` (on cuda) on the batch x (B, T, m), y (B,) (host
    arrays; bench.bench_inputs makes them): one row per option of `versions`, step first.

    Each row: model, version (the option, e.g. "persistent, matrix in global memory"), B, n, m,
    T, dtype, forward_ms (cell forward and readout, as `model.forward`), forward_backward_ms
    (everything `loss_and_grad` does on the GPU), both medians of `repeats` runs timed with CUDA
    events, and `note`: a pass the option cannot run (not timed), and "auto runs this" where
    the model's Tuner chose it (for both passes, or the one named).
    The batch is on the GPU before timing starts, batch-first as `Task.batches(device="cuda")`
    yields it, so host transfers are not included but its change to time-major layout is; the
    activations and gradients live in workspaces, as in training, so no allocation is timed.
    Under the CUDA simulator the times are meaningless and are reported as nan."""
    B, T, m = x.shape
    n, dtype = model.hidden_size, model.dtype
    x_batch = device_copy(np.ascontiguousarray(x, dtype=dtype))        # (B, T, m), as a task's
    y = device_copy(np.asarray(y, dtype=np.int64))
    ws, out = DeviceWorkspace(), DeviceWorkspace()
    fits = [options(model.cell, n, dtype, backward, model.launch) for backward in (False, True)]
    every = sorted(dict.fromkeys(fits[0] + fits[1]), key=lambda k: k.version != "step")
    chosen = model.kernels_for(B, T)
    rows = []
    for k in every:
        if k.version not in versions:
            continue
        row = dict(model=model.name, version=str(k), B=B, n=n, m=m, T=T, dtype=dtype.name,
                   forward_ms=float("nan"), forward_backward_ms=float("nan"), note="")
        misfits = [label for label, opts in (("forward", fits[0]), ("BPTT", fits[1]))
                   if k not in opts]
        notes = []
        if misfits:
            where = "registers" if k.version == "split" else "shared memory"
            notes.append(f"{k.version} {' and '.join(misfits)} "
                         f"{'does' if len(misfits) == 1 else 'do'} not fit in {where} at "
                         f"n={n}, {dtype.name}")
        be = CUDA(model.launch, k, k)
        if "forward" not in misfits:          # a forward that fits is timed even if BPTT is not
            row["forward_ms"] = elapsed_ms(lambda be=be: model.logits_on(
                be, time_major(x_batch, dtype, ws)), repeats, warmup)
        if not misfits:
            row["forward_backward_ms"] = elapsed_ms(lambda be=be: model.step_on(
                be, time_major(x_batch, dtype, ws), y, [out]), repeats, warmup)
        runs = [label for label, c in (("forward", chosen.forward), ("BPTT", chosen.backward))
                if c == k]
        if runs:
            notes.append("auto runs this" + ("" if len(runs) == 2 else f" ({runs[0]})")
                         + f", {chosen.how}")
        if simulator_enabled():
            row["forward_ms"] = row["forward_backward_ms"] = float("nan")
            notes.append("CUDA simulator: no timings")
        row["note"] = "; ".join(notes)
        rows.append(row)
    return rows
