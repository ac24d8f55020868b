"""Where a model's kernels run: the CPU or an NVIDIA GPU. A backend gives the cells (cells.py)
and the model (model.py) memory and runs a kernel's twins (`kernels.common.Twins`), so that each
cell's forward pass and BPTT, and the model's readout and loss, are written once for both:

    CPU                              the @njit twin, BLAS held to one thread (kernels/common.py)
    CUDA(launch, forward, backward)  the GPU twin, launched with `launch` (a Launch), a cell's
                                     forward and backward passes with the kernels chosen for
                                     each (a Kernels: step, or persistent with a matrix layout)

    h_T, cache = cell.forward(p, x, h0, ws, backend=CUDA(Launch(), Kernels("step"), ...))

What a backend provides: `buffer` (a workspace's array, or a fresh one), `states` (hs with h_0 in
place), `upstream` (dL/dh_T checked and where the kernels read it), `carried` (a second state's
gradient, which BPTT updates in place), `sequence` (a pass's lengths
and gradients at every step, as its kernels take them), `scalar` (a hyperparameter as the kernels
take it), `run` (a kernel's twin) and `run_pass` (a cell's pass, on cuda the version chosen for
it).

On cuda, which kernels a pass can run depends on the cell, n, the dtype and the launch
(`options`: the persistent kernels where a block's shared memory holds them, with the matrix
layouts the cell offers, then the step ones); nprnn/core/autotune.py times them and the model passes
the fastest. Kernel versions (nprnn/kernels/antisym.py explains them):
    "step"        one thread per (b, i), one launch per time step
    "persistent"  one launch per pass, each block owning batch rows for all T steps and keeping
                  their state in shared memory; the Euler family reads the recurrent matrix
                  from global memory, through the L1 and L2 caches, as the baselines read W_hh
                  (layout "global"), or keeps it in shared memory where it fits there too
                  (antisym: only its upper triangle, "skew"; the others all of it, "dense")
    "split"       one launch per pass as "persistent", with `lanes` threads per hidden unit,
                  each holding its share of the matrix in registers, their partial dot products
                  added by warp shuffles (the Euler family and rnn, where the matrix fits
                  registers)
    "auto"        the fastest that fits, as timed on this GPU (the default); untimed, the
                  first option: persistent with the matrix in global memory, else step
"""
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..kernels.common import one_blas_thread
from ..kernels.layout import time_major_gpu
from .memory import device_array, fill, to_device

VERSIONS = ("auto", "step", "persistent", "split")


def check_state(name, a, B, n):
    """h0 as a cell's forward takes it (None: zero) and dh_T as its backward takes it: one state
    per batch row, (B, n). (A NumPy assignment would broadcast an (n,) vector, and a kernel, which
    has no bounds checks, would read past a smaller array.)"""
    if a is not None and tuple(np.shape(a)) != (B, n):
        raise ValueError(f"{name} must have shape (B, n) = ({B}, {n}), got {tuple(np.shape(a))}")


def check_sequence(lengths, dhs, T, B, n):
    """lengths (B,) and dhs (T, B, n) as a cell's passes take them (None: none). The model checks
    the values of a user's lengths (inputs.lengths); this guards the kernels' reads."""
    if lengths is not None and tuple(lengths.shape) != (B,):
        raise ValueError(f"lengths must have shape (B,) = ({B},), got {tuple(lengths.shape)}")
    if dhs is not None and tuple(dhs.shape) != (T, B, n):
        raise ValueError(f"dhs must have shape (T, B, n) = ({T}, {B}, {n}), got "
                         f"{tuple(dhs.shape)}")


class Sequence(NamedTuple):
    """What a pass's CPU and step kernels take last (kernels/common.py, "Sequences"): `args`,
    (lengths,) forward and (dhs, lengths) in BPTT, with T-long rows and an empty dhs standing
    for none; `plain` where there are none, all rows T steps long and dL/dh_T the only gradient,
    the only case the persistent and split kernels run."""
    args: tuple
    plain: bool


@dataclass(frozen=True)
class Launch:
    """GPU launch settings: `step_block` (units, rows) per block of the step kernels; `threads`
    per block (None: n rounded up to a warp) and `rows` per block of the persistent kernels;
    `tile` of the parameter-gradient products; `readout_block` of the readout kernels (its first
    entry: threads per block of the softmax). The GPU tests use small ones, so that the CUDA
    simulator runs several small, ragged blocks."""
    step_block: tuple = (128, 1)
    threads: int = None
    rows: int = 1
    tile: int = 16
    readout_block: tuple = (16, 16)


LAUNCH = Launch()       # what a model on cuda takes when it is made (the GPU tests shrink it)


@dataclass(frozen=True)
class Kernels:
    """The kernels one pass runs: `version` "step", "persistent" or "split"; for an Euler cell's
    persistent kernels, where they read the matrix: `layout` "global", "skew" or "dense"; for
    the split ones, the threads per unit: `lanes`."""
    version: str
    layout: str = None
    lanes: int = None

    def __str__(self):
        if self.lanes is not None:
            return f"{self.version}, {self.lanes} lanes per unit, matrix in registers"
        if self.layout is None:
            return self.version
        where = ("global memory" if self.layout == "global" else
                 f"shared memory ({self.layout})")
        return f"{self.version}, matrix in {where}"

    @property
    def token(self):
        """"step", "persistent", "persistent/global" or "split/8": the key of the autotuner's
        cache file."""
        if self.lanes is not None:
            return f"{self.version}/{self.lanes}"
        return self.version if self.layout is None else f"{self.version}/{self.layout}"


def options(cell, n, dtype, backward, launch=None):
    """The Kernels that can run a pass of `cell` at n units, the one to prefer until timed
    first: the persistent kernels in each layout the cell offers that fits a block's shared
    memory (`cell.persistent_layouts`), the split ones with each number of lanes that fits
    (`cell.split_lanes`), then the step ones."""
    layouts = cell.persistent_layouts(n, dtype, backward, (launch or LAUNCH).rows)
    return ([Kernels("persistent", layout) for layout in layouts]
            + [Kernels("split", lanes=lanes) for lanes in cell.split_lanes(n, dtype)]
            + [Kernels("step")])


def resolve(cell, version, n, dtype, backward, launch=None):
    """The Kernels a pass runs for `version`: a Kernels (checked to fit), "step", "persistent"
    or "split" (the first such option) or "auto" (the first option; the model's autotuner
    passes Kernels it timed instead)."""
    fits = options(cell, n, dtype, backward, launch)
    if isinstance(version, Kernels):
        if version not in fits:
            raise ValueError(f"{cell.name} cannot run '{version}' "
                             f"{'BPTT' if backward else 'forward'} at n={n}, "
                             f"{np.dtype(dtype).name}; it can run: {', '.join(map(str, fits))}")
        return version
    if version not in VERSIONS:
        raise ValueError(f"GPU kernel version must be one of {VERSIONS}, got {version!r}")
    if version == "auto":
        return fits[0]
    chosen = [k for k in fits if k.version == version]
    if chosen:
        return chosen[0]
    if version == "split":
        raise ValueError(f"{cell.name} has no split kernels that fit n={n} in "
                         f"{np.dtype(dtype).name}; it can run: {', '.join(map(str, fits))}")
    return Kernels(version, cell.unfitting_layout)   # the kernel's own check says what is wrong


class CPUBackend:
    """The CPU: NumPy arrays, the @njit twins."""
    device = "cpu"

    def buffer(self, ws, name, shape, dtype):
        """A workspace's array under `name`, or a fresh one when there is no workspace."""
        if ws is None:
            return np.empty(tuple(int(s) for s in shape), dtype=np.dtype(dtype))
        return ws.get(name, shape, dtype)

    def states(self, ws, name, x, n, h0=None, label="h0"):
        """hs (T+1, B, n) for time-major x (T, B, m), with hs[0] = h_0 (zero unless given;
        `label` names it in errors)."""
        T, B, _ = x.shape
        check_state(label, h0, B, n)
        hs = self.buffer(ws, name, (T + 1, B, n), x.dtype)
        hs[0] = 0.0 if h0 is None else h0
        return hs

    def upstream(self, dh_T, hs, label="dh_T"):
        """dL/dh_T checked against the states hs (T+1, B, n), contiguous in their dtype (None:
        zero, where the gradients enter at every step)."""
        if dh_T is None:
            return np.zeros(hs.shape[1:], dtype=hs.dtype)
        check_state(label, dh_T, *hs.shape[1:])
        return np.ascontiguousarray(dh_T, dtype=hs.dtype)

    def carried(self, ws, name, d_T, states, label):
        """The workspace's (B, n) array `name` for a second state's gradient that a BPTT kernel
        carries back in place (the LSTMs' c, coRNN's and LEM's z): d_T = dL/d(state T), checked
        against states (T+1, B, n) (None: 0), in; dL/d(state 0) out."""
        d = self.buffer(ws, name, states.shape[1:], states.dtype)
        if d_T is None:
            d[...] = 0
        else:
            check_state(label, d_T, *states.shape[1:])
            d[...] = d_T
        return d

    def sequence(self, ws, x, n, lengths=None, dhs=None, backward=False):
        """The Sequence of a pass over time-major x (T, B, m) at n units: lengths (B,) int64 in
        [1, T] (None: all T), and in BPTT dhs (T, B, n) (None: none)."""
        T, B, _ = x.shape
        check_sequence(lengths, dhs, T, B, n)
        plain = lengths is None and dhs is None
        if lengths is None:
            lengths = self.buffer(ws, "lengths_T", (B,), np.int64)
            lengths[:] = T
        if not backward:
            return Sequence((lengths,), plain)
        if dhs is None:
            dhs = self.buffer(ws, "no_dhs", (0, B, n), x.dtype)
        return Sequence((dhs, lengths), plain)

    def scalar(self, value, dtype):
        return np.dtype(dtype).type(value)     # float32 models compute in float32 throughout

    def to_host(self, a):
        """A NumPy copy of `a` (a workspace's array is overwritten by the next call)."""
        return np.array(a)

    def upload(self, a, dtype, staging=None, name=None):
        return a

    def run(self, twins, *args):
        with one_blas_thread():       # BLAS's own threads would spin on after it (common.py)
            twins.cpu(*args)

    def run_pass(self, twins, backward, *args, sequence):
        """A cell's pass: its CPU twin on `args`, then its Sequence's."""
        with one_blas_thread():
            twins.cpu(*args, *sequence.args)


CPU = CPUBackend()


class CUDA:
    """An NVIDIA GPU: numba device arrays, the GPU twins launched with `launch`; a cell's forward
    pass runs the kernels `forward`, its BPTT `backward` (each a Kernels, or a version name that
    `for_cell` resolves)."""
    device = "cuda"

    def __init__(self, launch=None, forward=Kernels("step"), backward=Kernels("step")):
        self.launch, self.forward, self.backward = launch or LAUNCH, forward, backward

    @classmethod
    def for_cell(cls, cell, n, dtype, version="auto", launch=None):
        """The backend running `cell` at n units with `version` (a name or a Kernels)."""
        launch = launch or LAUNCH
        return cls(launch, *(resolve(cell, version, n, dtype, backward, launch)
                             for backward in (False, True)))

    def buffer(self, ws, name, shape, dtype):
        if ws is None:
            return device_array(tuple(int(s) for s in shape), np.dtype(dtype))
        return ws.get(name, shape, dtype)

    def states(self, ws, name, x, n, h0=None, label="h0"):
        T, B, _ = x.shape
        check_state(label, h0, B, n)
        hs = self.buffer(ws, name, (T + 1, B, n), x.dtype)
        if h0 is None:
            fill(hs[0], 0)
        else:
            hs[0].copy_to_device(to_device(h0, x.dtype))
        return hs

    def upstream(self, dh_T, hs, label="dh_T"):
        if dh_T is None:
            zero = device_array(hs.shape[1:], hs.dtype)
            fill(zero, 0)
            return zero
        check_state(label, dh_T, *hs.shape[1:])
        return to_device(dh_T, hs.dtype)

    def carried(self, ws, name, d_T, states, label):
        d = self.buffer(ws, name, states.shape[1:], states.dtype)
        if d_T is None:
            fill(d, 0)
        else:
            check_state(label, d_T, *states.shape[1:])
            d.copy_to_device(to_device(d_T, states.dtype))
        return d

    def sequence(self, ws, x, n, lengths=None, dhs=None, backward=False):
        T, B, _ = x.shape
        check_sequence(lengths, dhs, T, B, n)
        plain = lengths is None and dhs is None
        if lengths is None:
            lengths = self.buffer(ws, "lengths_T", (B,), np.int64)
            fill(lengths, T)
        if not backward:
            return Sequence((lengths,), plain)
        if dhs is None:
            dhs = self.buffer(ws, "no_dhs", (0, B, n), x.dtype)
        return Sequence((dhs, lengths), plain)

    def scalar(self, value, dtype):
        return float(value)

    def to_host(self, a):
        return a.copy_to_host()

    def upload(self, a, dtype, staging=None, name=None):
        """`a` on the device (a host array is copied into slot `name` of `staging` if given)."""
        return to_device(a, dtype, staging, name)

    def run(self, twins, *args):
        twins.gpu(*args, **(twins.gpu_options(self.launch) if twins.gpu_options else {}))

    def run_pass(self, twins, backward, *args, sequence):
        k = self.backward if backward else self.forward
        if k.version != "step" and not sequence.plain:
            raise ValueError(f"the {k.version} kernels take neither lengths nor gradients at "
                             f"every step: run the step kernels (a model does so by itself)")
        if k.version == "step":
            run, opts = twins.gpu, dict(block=self.launch.step_block)
            args += sequence.args
        elif k.version == "split":
            run, opts = twins.gpu_split, dict(lanes=k.lanes, rows=self.launch.rows)
        else:
            run, opts = twins.gpu_persistent, dict(threads=self.launch.threads,
                                                   rows=self.launch.rows)
            if k.layout is not None:
                opts["layout"] = k.layout
        if backward:
            opts["tile"] = self.launch.tile
        run(*args, **opts)


def time_major(x, dtype, ws=None):
    """x (B, T, m) on the device -> (T, B, m) of `dtype` on the device (a workspace buffer when
    ws is given), the layout the kernels read."""
    B, T, m = x.shape
    out = CUDA().buffer(ws, "x_time_major", (T, B, m), dtype)
    time_major_gpu(out, x)
    return out
