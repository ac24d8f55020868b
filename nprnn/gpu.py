"""The GPU path: each cell's forward pass and BPTT, the readout and the loss as kernel launches on
device arrays (their memory: nprnn/memory.py; timing them: nprnn/autotune.py).

    model = nprnn.make_model("antisym", 1, 128, 10, device="cuda")
    loss, grads = model.loss_and_grad(x, y)       # x, y NumPy; grads stay on the GPU

What stays on the GPU: the parameters (`model.params` holds numba device arrays), the gradients,
every activation BPTT needs, and the optimizer state, which kernels/optim.py's GPU twins update
in place. Activations live in a per-model `DeviceWorkspace`, allocated once for the largest batch seen
and reused (evaluation's larger and shorter batches and training's share it); the gradients of
a training step (`model.step_arrays`) in a second one: a fresh device array costs a cudaMalloc,
and numba frees dead ones in batches with cudaFree, which waits for the whole GPU.
Per step the batch and its labels go in, through a `Staging`: page-locked buffers and
asynchronous copies, so that the host makes the next batch while the GPU runs this step; the loss
stays on the GPU until the training loop reads its running totals.

Kernel versions (nprnn/kernels/antisym.py explains them), each pass's choice a `Kernels` value:
    "step"        one thread per (b, i), one launch per time step
    "persistent"  one launch per pass, each block owning batch rows for all T steps and keeping
                  their state in shared memory; the Euler family reads the recurrent matrix
                  from global memory, through the L1 and L2 caches, as the baselines read W_hh
                  (layout "global"), or keeps it in shared memory where it fits there too
                  (antisym: only its upper triangle, "skew"; the others all of it, "dense")
    "auto"        the fastest that fits, as nprnn/autotune.py timed it on this GPU (the
                  default; `model.gpu_version` picks another); untimed, the first of
                  `GPUCell.options`: persistent with the matrix in global memory, else step

Cells are registered in GPU_CELLS under their names in nprnn.CELLS; tests/gpu checks every cell
against its CPU twin through this module, so a cell without GPU kernels fails there.
"""
from dataclasses import dataclass

import numpy as np

from .cells import DEFAULT_EPS, DEFAULT_GAMMA, CELLS, check_state
from .kernels import antisym as K_euler
from .kernels import gru as K_gru
from .kernels import lstm as K_lstm
from .kernels import readout as K_readout
from .kernels import rnn as K_rnn
from .kernels.gpu_common import SHARED_BYTES_MAX, device_array, fill
from .kernels.layout import time_major_gpu
from .memory import to_device

VERSIONS = ("auto", "step", "persistent")

# Launch configuration of the model path: `step_block` (units, rows) per block of the step
# kernels; `threads` per block (None: n rounded up to a warp) and `rows` per block of the
# persistent kernels; `tile` of the parameter-gradient products; `readout_block` of the readout
# kernels (and its first entry: threads per block of the softmax). The tests shrink these so that
# the CUDA simulator runs several small blocks.
LAUNCH = dict(step_block=(128, 1), threads=None, rows=1, tile=16, readout_block=(16, 16))


@dataclass(frozen=True)
class Kernels:
    """The kernels one pass runs: `version` "step" or "persistent" and, for an Euler cell's
    persistent kernels, where they read the matrix: `layout` "global", "skew" or "dense"."""
    version: str
    layout: str = None

    def __str__(self):
        if self.layout is None:
            return self.version
        where = ("global memory" if self.layout == "global" else
                 f"shared memory ({self.layout})")
        return f"{self.version}, matrix in {where}"

    @property
    def token(self):
        """"step", "persistent" or "persistent/global": the key of the autotuner's cache file."""
        return self.version if self.layout is None else f"{self.version}/{self.layout}"


def _launch(kernels, backward):
    """Keyword launch options of a kernel host function running `kernels` (a Kernels)."""
    if kernels.version == "step":
        opts = dict(block=LAUNCH["step_block"])
    else:
        opts = dict(threads=LAUNCH["threads"], rows=LAUNCH["rows"])
        if kernels.layout is not None:
            opts["layout"] = kernels.layout
    if backward:
        opts["tile"] = LAUNCH["tile"]
    return opts


# ------------------------------------------------------------------------------------------
# Device arrays, and batches uploaded without waiting for the GPU
# ------------------------------------------------------------------------------------------

def time_major(x, dtype, ws=None):
    """x (B, T, m) on the device -> (T, B, m) of `dtype` on the device (a workspace buffer when
    ws is given), the layout the kernels read."""
    B, T, m = x.shape
    out = _buffer(ws, "x_time_major", (T, B, m), dtype)
    time_major_gpu(out, x)
    return out


def _buffer(ws, name, shape, dtype):
    """A workspace buffer, or a fresh device array when there is no workspace."""
    if ws is None:
        return device_array(tuple(int(s) for s in shape), np.dtype(dtype))
    return ws.get(name, shape, dtype)


# ------------------------------------------------------------------------------------------
# Cells
# ------------------------------------------------------------------------------------------

class GPUCell:
    """The GPU side of one entry of nprnn.CELLS: the same contract as Cell.forward/backward
    (time-major x (T, B, m); returns (h_T, cache) and (grads, dh_0)), on device arrays."""

    def __init__(self, cell):
        self.cell = cell

    def options(self, n, dtype, backward):
        """The Kernels that can run a pass at this size, the one to prefer until timed first:
        the persistent kernels where a block's shared memory fits them, then the step ones."""
        raise NotImplementedError

    def persistent_fits(self, n, dtype, backward):
        """Whether a persistent kernel of this cell fits in shared memory at this size."""
        return self.options(n, dtype, backward)[0].version == "persistent"

    def resolve(self, version, n, dtype, backward):
        """The Kernels a pass runs for `version`: a Kernels (checked to fit), "step",
        "persistent" (the preferred persistent option) or "auto" (the preferred option; the
        model's autotuner passes Kernels it timed instead)."""
        options = self.options(n, dtype, backward)
        if isinstance(version, Kernels):
            if version not in options:
                raise ValueError(f"{self.cell.name} cannot run '{version}' "
                                 f"{'BPTT' if backward else 'forward'} at n={n}, "
                                 f"{np.dtype(dtype).name}; it can run: "
                                 f"{', '.join(map(str, options))}")
            return version
        if version not in VERSIONS:
            raise ValueError(f"GPU kernel version must be one of {VERSIONS}, got {version!r}")
        if version == "auto":
            return options[0]
        chosen = [k for k in options if k.version == version]
        if not chosen:               # the persistent kernel's own check says what does not fit
            return Kernels(version, self._unfitting_layout())
        return chosen[0]

    def _unfitting_layout(self):
        return None

    def forward(self, p, x, h0=None, version="auto", ws=None, **hyper):
        raise NotImplementedError

    def backward(self, p, cache, dh_T, ws=None, out=None, version=None, **hyper):
        """(grads, dh_0); `out` is a Workspace to hold them (fresh arrays when None); `version`
        as forward's (None: what the forward pass was asked for, a Kernels value aside)."""
        raise NotImplementedError


def _backward_version(cache):
    """The version BPTT runs when none is given: the forward pass's, where that was a name."""
    version = cache["version"]
    return version.version if isinstance(version, Kernels) else version


def _gradients(out, p, B, n, dtype):
    """Arrays for the gradients of the parameters p and for dh_0 (B, n): buffers of the
    workspace `out`, or fresh device arrays when it is None."""
    g = {k: _buffer(out, f"d{k}", v.shape, v.dtype) for k, v in p.items()}
    return g, _buffer(out, "dh0", (B, n), dtype)


def _device_dh_T(dh_T, hs):
    """dL/dh_T checked against the states hs (T+1, B, n), on the device in their dtype (the twin
    of cells._dh_T)."""
    check_state("dh_T", dh_T, *hs.shape[1:])
    return to_device(dh_T, hs.dtype)


def _initial_states(ws, x, n, h0):
    """hs (T+1, B, n) on the device with hs[0] = h_0 (zero unless given)."""
    T, B, _ = x.shape
    check_state("h0", h0, B, n)
    hs = _buffer(ws, "hs", (T + 1, B, n), x.dtype)
    if h0 is None:
        fill(hs[0], 0)
    else:
        hs[0].copy_to_device(to_device(h0, x.dtype))
    return hs


class EulerGPU(GPUCell):
    """antisym, antisym-gated, ablation, feedback: the kernels of nprnn/kernels/antisym.py.
    Their persistent passes keep the matrix in shared memory where it fits (the antisymmetric
    models only its upper triangle: the "skew" layout; the others all of it: "dense") and read
    it from global memory where it does not ("global")."""

    def options(self, n, dtype, backward):
        layouts = K_euler.persistent_layouts(n, dtype, self.cell.antisymmetric,
                                             backward=backward, rows=LAUNCH["rows"])
        return [Kernels("persistent", layout) for layout in layouts] + [Kernels("step")]

    def _unfitting_layout(self):
        return "global"

    def matrix(self, W, gamma, ws):
        """A on the device: W - W^T - gamma I (antisym), W - gamma I (ablation), W (feedback)."""
        if self.cell.antisymmetric:
            A = _buffer(ws, "A", W.shape, W.dtype)
            K_euler.antisym_matrix_gpu(A, W, gamma)
            return A
        if self.cell.diffusion:
            A = _buffer(ws, "A", W.shape, W.dtype)
            K_euler.shifted_matrix_gpu(A, W, gamma)
            return A
        return W

    def forward(self, p, x, h0=None, version="auto", ws=None, eps=DEFAULT_EPS,
                gamma=DEFAULT_GAMMA):
        T, B, _ = x.shape
        n = p["b_h"].shape[0]
        A = self.matrix(p["W"], gamma, ws)
        hs = _initial_states(ws, x, n, h0)
        th = _buffer(ws, "th", (T, B, n), x.dtype)
        cache = dict(x=x, A=A, hs=hs, th=th, version=version)
        k = self.resolve(version, n, x.dtype, backward=False)
        opts = _launch(k, False)
        if self.cell.gated:
            z = cache["z"] = _buffer(ws, "z", (T, B, n), x.dtype)
            run = (K_euler.euler_gated_forward_gpu_persistent if k.version == "persistent"
                   else K_euler.euler_gated_forward_gpu)
            run(hs, th, z, x, A, p["V_h"], p["b_h"], p["V_z"], p["b_z"], eps, **opts)
        else:
            run = (K_euler.euler_forward_gpu_persistent if k.version == "persistent"
                   else K_euler.euler_forward_gpu)
            run(hs, th, x, A, p["V_h"], p["b_h"], eps, **opts)
        return hs[T], cache

    def backward(self, p, cache, dh_T, ws=None, out=None, version=None, eps=DEFAULT_EPS,
                 gamma=DEFAULT_GAMMA):
        x, A, hs, th = cache["x"], cache["A"], cache["hs"], cache["th"]
        T, B, _ = x.shape
        n = A.shape[0]
        dh_T = _device_dh_T(dh_T, hs)
        g, dh0 = _gradients(out, p, B, n, x.dtype)
        # the antisymmetric models turn dA into dW; the others' dW is dA itself
        dA = _buffer(ws, "dA", A.shape, A.dtype) if self.cell.antisymmetric else g["W"]
        da = _buffer(ws, "da", (T, B, n), x.dtype)
        k = self.resolve(version or _backward_version(cache), n, x.dtype, backward=True)
        opts = _launch(k, True)
        if self.cell.gated:
            dzp = _buffer(ws, "dzp", (T, B, n), x.dtype)
            ds = _buffer(ws, "ds", (T, B, n), x.dtype)
            run = (K_euler.euler_gated_backward_gpu_persistent if k.version == "persistent"
                   else K_euler.euler_gated_backward_gpu)
            run(dA, g["V_h"], g["b_h"], g["V_z"], g["b_z"], dh0, da, dzp, ds,
                dh_T, hs, th, cache["z"], x, A, eps, **opts)
        else:
            run = (K_euler.euler_backward_gpu_persistent if k.version == "persistent"
                   else K_euler.euler_backward_gpu)
            run(dA, g["V_h"], g["b_h"], dh0, da, dh_T, hs, th, x, A, eps, **opts)
        if self.cell.antisymmetric:
            K_euler.antisym_dW_gpu(g["W"], dA)
        return g, dh0


class StackedGPU(GPUCell):
    """rnn, lstm, peephole-lstm, gru: the kernels of nprnn/kernels/rnn.py, lstm.py, gru.py.
    Their persistent kernels keep only the rows' state in shared memory (the module's
    FORWARD_VALUES and BACKWARD_VALUES vectors of n per row) and read W_hh from global memory."""

    def __init__(self, cell, module, prefix):
        super().__init__(cell)
        self.module, self.prefix = module, prefix

    def options(self, n, dtype, backward):
        values = self.module.BACKWARD_VALUES if backward else self.module.FORWARD_VALUES
        fits = values * n * LAUNCH["rows"] * np.dtype(dtype).itemsize <= SHARED_BYTES_MAX
        return [Kernels("persistent")] * fits + [Kernels("step")]

    def _kernel(self, direction, kernels):
        suffix = "_persistent" if kernels.version == "persistent" else ""
        return getattr(self.module, f"{self.prefix}_{direction}_gpu{suffix}")

    def _peepholes(self, p):
        return (p["w_ci"], p["w_cf"], p["w_co"]) if self.prefix == "peephole_lstm" else ()

    def forward(self, p, x, h0=None, version="auto", ws=None, **hyper):
        self.cell._no_hyper(hyper)
        T, B, _ = x.shape
        n = p["weight_hh"].shape[1]
        hs = _initial_states(ws, x, n, h0)
        cache = dict(x=x, hs=hs, version=version)
        if self.prefix == "rnn":
            state = (hs,)
        elif self.prefix == "gru":
            cache["gates"] = _buffer(ws, "gates", (T, B, 3 * n), x.dtype)
            cache["hn"] = _buffer(ws, "hn", (T, B, n), x.dtype)
            state = (hs, cache["gates"], cache["hn"])
        else:
            cs = cache["cs"] = _buffer(ws, "cs", (T + 1, B, n), x.dtype)
            fill(cs[0], 0)                                  # c_0 = 0: h0 sets h_0 only
            cache["gates"] = _buffer(ws, "gates", (T, B, 4 * n), x.dtype)
            state = (hs, cs, cache["gates"])
        k = self.resolve(version, n, x.dtype, backward=False)
        self._kernel("forward", k)(*state, x, p["weight_ih"], p["weight_hh"], p["bias_ih"],
                                   p["bias_hh"], *self._peepholes(p), **_launch(k, False))
        return hs[T], cache

    def backward(self, p, cache, dh_T, ws=None, out=None, version=None, **hyper):
        self.cell._no_hyper(hyper)
        x, hs = cache["x"], cache["hs"]
        T, B, _ = x.shape
        n = p["weight_hh"].shape[1]
        dh_T = _device_dh_T(dh_T, hs)
        g, dh0 = _gradients(out, p, B, n, x.dtype)
        dW = (g["weight_ih"], g["weight_hh"], g["bias_ih"], g["bias_hh"])
        W_hh = p["weight_hh"]
        if self.prefix == "rnn":
            da = _buffer(ws, "da", (T, B, n), x.dtype)
            args = dW + (dh0, da, dh_T, hs, x, W_hh)
        elif self.prefix == "gru":
            dgi = _buffer(ws, "dgi", (T, B, 3 * n), x.dtype)
            dgh = _buffer(ws, "dgh", (T, B, 3 * n), x.dtype)
            args = dW + (dh0, dgi, dgh, dh_T, hs, cache["gates"], cache["hn"], x, W_hh)
        else:
            da = _buffer(ws, "da", (T, B, 4 * n), x.dtype)
            state = (hs, cache["cs"], cache["gates"], x, W_hh)
            if self.prefix == "lstm":
                args = dW + (dh0, da, dh_T) + state
            else:
                args = (dW + (g["w_ci"], g["w_cf"], g["w_co"], dh0, da, dh_T) + state
                        + self._peepholes(p))
        k = self.resolve(version or _backward_version(cache), n, x.dtype, backward=True)
        self._kernel("backward", k)(*args, **_launch(k, True))
        return g, dh0


GPU_CELLS = {}


def register(gpu_cell):
    GPU_CELLS[gpu_cell.cell.name] = gpu_cell
    return gpu_cell


def gpu_cell(name):
    """The GPU side of cell `name` (a key of nprnn.CELLS)."""
    if name not in GPU_CELLS:
        raise ValueError(f"model {name!r} has no GPU kernels; models with GPU kernels: "
                         f"{', '.join(GPU_CELLS)}")
    return GPU_CELLS[name]


def _register_all():
    for name in ("antisym", "antisym-gated", "ablation", "feedback"):
        register(EulerGPU(CELLS[name]))
    register(StackedGPU(CELLS["rnn"], K_rnn, "rnn"))
    register(StackedGPU(CELLS["lstm"], K_lstm, "lstm"))
    register(StackedGPU(CELLS["peephole-lstm"], K_lstm, "peephole_lstm"))
    register(StackedGPU(CELLS["gru"], K_gru, "gru"))


_register_all()


# ------------------------------------------------------------------------------------------
# The model: cell + readout + softmax cross-entropy (Model.forward / loss_and_grad on cuda)
# ------------------------------------------------------------------------------------------

def model_hidden(model, xt, kernels=("auto", "auto"), ws=None, staging=None):
    """h_T (B, n) on the device for time-major x (T, B, m) (host or device; a host x is copied
    into slot "x" of `staging` if given). `kernels`: the versions of the forward and backward
    passes (names or Kernels values; the model's autotuner chooses them)."""
    x = to_device(xt, model.dtype, staging, "x")
    runner = gpu_cell(model.name)
    h_T, _ = runner.forward(model.cell_params(), x, None, kernels[0], ws, **model.hyper)
    return h_T


def model_logits(model, xt, kernels=("auto", "auto"), ws=None, staging=None):
    """logits (B, K) on the device."""
    h_T = model_hidden(model, xt, kernels, ws, staging)
    logits = _buffer(ws, "logits", (h_T.shape[0], model.num_classes), model.dtype)
    K_readout.readout_forward_gpu(logits, h_T, model.params["W_out"], model.params["b_out"],
                                  block=LAUNCH["readout_block"])
    return logits


def model_loss_and_grad(model, xt, y, kernels=("auto", "auto"), ws=None, out=None,
                        staging=None):
    """(losses (B,), grads, logits (B, K)), all on the device, for time-major x (T, B, m) and
    labels y (B,). The mean of `losses` is the loss; grads has the keys of model.params and
    lives in the Workspace `out` (fresh arrays when None). Host arrays are copied into slots
    "x" and "y" of `staging` if given."""
    x = to_device(xt, model.dtype, staging, "x")
    y = to_device(y, np.int64, staging, "y")
    p = model.params
    runner = gpu_cell(model.name)
    h_T, cache = runner.forward(model.cell_params(), x, None, kernels[0], ws, **model.hyper)
    B, K = h_T.shape[0], model.num_classes
    logits = _buffer(ws, "logits", (B, K), model.dtype)
    block = LAUNCH["readout_block"]
    K_readout.readout_forward_gpu(logits, h_T, p["W_out"], p["b_out"], block=block)
    losses = _buffer(ws, "losses", (B,), model.dtype)
    dlogits = _buffer(ws, "dlogits", (B, K), model.dtype)
    K_readout.softmax_xent_gpu(losses, dlogits, logits, y, threads=block[0])
    dW_out = _buffer(out, "dW_out", p["W_out"].shape, model.dtype)
    db_out = _buffer(out, "db_out", p["b_out"].shape, model.dtype)
    dh_T = _buffer(ws, "dh_T", h_T.shape, model.dtype)
    K_readout.readout_backward_gpu(dW_out, db_out, dh_T, dlogits, h_T, p["W_out"], block=block)
    grads, _ = runner.backward(model.cell_params(), cache, dh_T, ws, out, kernels[1],
                               **model.hyper)
    grads.update(W_out=dW_out, b_out=db_out)
    return losses, grads, logits
