"""A model is a cell (or `layers` of it, stacked) plus the readout:
x (B, T, m) -> h_T (B, n) -> outputs (B, K) -> loss, or with readout="every" h_1 .. h_T ->
outputs (B, T, K) -> a loss over every step. lengths (B,) end each row at its own step.

The loss is softmax cross-entropy over K classes (loss="xent", labels y (B,), or (B, T) with -1
for a step without loss) or the mean squared error of K real outputs (loss="mse", targets y
(B, K) or (B, T, K)), a mean over the entries counted (steps past a row's length do not count);
the readout's outputs are the logits of the one and the predictions of the other
(nprnn/kernels/readout.py).

`Model.loss_and_grad` is full BPTT: the readout's backward gives dL/dh_T (or dL/dh_t at every
step), each layer's backward carries it through all T steps and hands dL/dx to the layer below
(kernels/stack.py). Inputs are validated here, once, so the kernels can trust them.
With layers > 1, layer k's parameters are the cell's names with the suffix _l{k}, as nn.LSTM
names them (weight_ih_l0, W_l1, ...); one layer keeps the plain names.

The forward pass, the loss and BPTT are written once (`step_on`): a backend (nprnn/core/backends.py)
runs each kernel's CPU or GPU twin. On device "cuda" `params` and the gradients are numba device
arrays that stay on the GPU (`host_params()` copies the parameters out), while y, the loss, the
logits and h_T cross as NumPy values, as on the CPU; x may be a NumPy array or a device array
(`Task.batches(..., device="cuda")` makes batches on the GPU).
"""
import warnings
from typing import NamedTuple

import numpy as np

from . import autotune, backends, inputs
from .backends import CPU, CUDA, time_major
from .cells import CELLS, gaussian
from .device import DEVICES, resolve_device
from ..kernels import readout as K_readout
from ..kernels.common import one_blas_thread
from .memory import (DeviceWorkspace, Staging, Workspace, is_device_array, memory_of, to_device,
                     to_host)

DTYPES = ("float32", "float64")
LOSSES = ("xent", "mse")            # softmax cross-entropy (classes), mean squared error (outputs)
READOUTS = ("last", "every")        # from h at each row's last step; from h_t at every step
# the loss kernels (twins) of each loss; each writes (losses (R,), d outputs (R, K)) from the
# readout's outputs, y and the rows' weights
LOSS_KERNELS = {"xent": K_readout.softmax_xent, "mse": K_readout.mse}
READOUT_NAMES = ("W_out", "b_out")


def count_params(cell, m, n, K, layers=1):
    """Parameters of a model: the cell's at input size m and n units (cell.num_params), those of
    the layers above it (input size n), and the readout's, W_out (K, n) and b_out (K,)."""
    return cell.num_params(m, n) + (layers - 1) * cell.num_params(n, n) + K * n + K


def layer_names(cell, layers):
    """[{model's parameter name: the cell's name}] for each layer: the plain names for one
    layer, with the suffix _l{k} for layer k of several (as nn.LSTM's weight_ih_l0)."""
    names = list(cell.shapes(1, 1))
    if layers == 1:
        return [{k: k for k in names}]
    return [{f"{k}_l{layer}": k for k in names} for layer in range(layers)]


class Step(NamedTuple):
    """A training step's arrays (Model.step_arrays), left where they were computed: `losses`
    (R,), each row's own loss (0 for a row not counted); `grads`; `outputs` (R, K); `y` (R,)
    int64 labels or (R, K) targets; `weights` (R,) float64, each row's share of the mean (0 for
    a row not counted: kernels/readout.py). R = B for a last-step readout, T*B (row t B + b) for
    one at every step. The loss is sum(weights * losses)."""
    losses: object
    grads: dict
    outputs: object
    y: object
    weights: object

    def loss(self):
        """The step's loss, a Python float (on cuda this waits for the GPU)."""
        w, losses = to_host(self.weights), to_host(self.losses).astype(np.float64)
        with one_blas_thread():     # as the kernels: a sum over T*B rows would wake BLAS's threads
            return float(np.dot(w, losses))


class Model:
    def __init__(self, cell, input_size, hidden_size, num_classes, params, hyper, dtype,
                 device="cpu", sigma_w=1.0, init="paper", seed=0, gate_bias=0.0, loss="xent",
                 layers=1, readout="last"):
        self.cell = cell
        self.loss = loss                        # "xent" or "mse" (LOSSES)
        self.layers, self.readout = layers, readout
        self._names = layer_names(cell, layers)
        self.input_size, self.hidden_size, self.num_classes = input_size, hidden_size, num_classes
        self.hyper = hyper
        self.dtype = np.dtype(dtype)
        self.device = device
        # The same code runs on both devices; what differs is chosen here, once. On cuda: the
        # launch settings (a backends.Launch), the kernel version ("auto", "step" or
        # "persistent"; nprnn/core/backends.py) and the autotuner that chooses for "auto"
        # (nprnn/core/autotune.py). Buffers reused from call to call: the activations (`_workspace`),
        # on cuda also the returned outputs and a training step's gradients (on the CPU these
        # are fresh arrays, the caller's to keep), and the uploads of x and y.
        self.gpu_version = "auto"
        self.launch = backends.LAUNCH
        self.tuner = None
        self._workspace = Workspace()
        self._inputs = Workspace()             # the host's time-major copy of x, on both devices
        self._outputs = self._step_grads = self._uploads = None
        self._layer_grads = [None] * layers
        if device == "cuda":
            self.tuner = autotune.Tuner.for_this_gpu()
            params = {k: to_device(v) for k, v in params.items()}
            self._workspace = self._outputs = DeviceWorkspace()
            self._step_grads = DeviceWorkspace()
            self._layer_grads = [self._step_grads] + [DeviceWorkspace() for _ in range(1, layers)]
            self._uploads = Staging()           # host x and y, copied without waiting for the GPU
        # each layer's activations in a workspace of its own (the names are the cell's)
        self._layer_ws = [self._workspace] + [type(self._workspace)() for _ in range(1, layers)]
        self._warned = set()
        self.params = params
        # what the kernels are built for: each parameter's shape, dtype and memory (_check_params)
        self._param_specs = {k: (tuple(v.shape), v.dtype, memory_of(v)) for k, v in params.items()}
        self.config = dict(model=cell.name, input_size=input_size, hidden_size=hidden_size,
                           num_classes=num_classes, dtype=self.dtype.name, sigma_w=sigma_w,
                           init=init, seed=seed, gate_bias=gate_bias, **hyper)
        if cell.w_form is not None:
            self.config["w_form"] = cell.w_form
        if loss != "xent":
            self.config["loss"] = loss          # num_classes is then the output size
        if layers != 1:
            self.config["layers"] = layers
        if readout != "last":
            self.config["readout"] = readout

    @property
    def name(self):
        return self.cell.name

    def num_params(self):
        return count_params(self.cell, self.input_size, self.hidden_size, self.num_classes,
                            self.layers)

    def cell_params(self, layer=0):
        """Layer `layer`'s parameters under the cell's own names (what its passes take)."""
        return {k: self.params[name] for name, k in self._names[layer].items()}

    def host_params(self):
        """The parameters as NumPy arrays (copies, on either device)."""
        return to_host(self.params)

    # -- validation ----------------------------------------------------------------------------
    def _check_params(self):
        """The parameters are what the kernels were built for: their names, shapes, dtype and
        memory (a caller may have replaced one, say with weights loaded as float32)."""
        if self.params.keys() != self._param_specs.keys():
            raise ValueError(f"model.params must hold {sorted(self._param_specs)}, got "
                             f"{sorted(self.params)}")
        for k, v in self.params.items():
            shape, dtype, _ = spec = self._param_specs[k]
            if (tuple(v.shape), v.dtype, memory_of(v)) != spec:
                raise ValueError(f"model.params[{k!r}] is a {memory_of(v)} array of shape "
                                 f"{tuple(v.shape)} and dtype {v.dtype}; this {self.device} model "
                                 f"needs shape {shape} and dtype {dtype}")
            if isinstance(v, np.ndarray) and not v.flags.c_contiguous:
                raise ValueError(f"model.params[{k!r}] is not C-contiguous (a transposed or "
                                 f"strided view?); the kernels and optimizers need it so: "
                                 f"np.ascontiguousarray(...)")

    def _check_x(self, x):
        """x as the kernels read it (time-major, the model's dtype), after checking it and the
        parameters (nprnn/core/inputs.py): every call into the kernels passes through here."""
        self._check_params()
        if not is_device_array(x):
            return inputs.time_major_host(x, self.input_size, self.dtype, self._inputs)
        if self.device != "cuda":
            raise TypeError("x is a GPU array but this model is on the cpu: make the model with "
                            "device='cuda', or pass x.copy_to_host()")
        # not scanned for NaN or Inf (that would mean a copy to the host); the training loop
        # still stops on a non-finite loss
        inputs.check_batch(x, self.input_size)
        return time_major(x, self.dtype, self._workspace)

    def _check_lengths(self, lengths, xt):
        """lengths as the kernels take them, on the model's device: None where every row is T
        steps long (the fast GPU kernels then run), else int64 (B,) in [1, T]."""
        T, B, _ = xt.shape
        lengths = inputs.lengths(lengths, B, T)
        if lengths is None or self.device == "cpu":
            return lengths
        return to_device(lengths)

    def _rows(self, y, B, T, lengths):
        """(y, weights) as the loss kernels read them, on the host: the last step's labels (B,)
        int64 or targets (B, K), or every step's as time-major rows (T*B,) or (T*B, K); each
        row's weight (float64): 1/N for the N rows counted, 0 for a label -1 or a step past the
        row's length."""
        K = self.num_classes
        if self.readout == "last":
            y = (inputs.targets(y, B, K, self.dtype) if self.loss == "mse"
                 else inputs.labels(y, B, K))
            return y, np.full(B, 1.0 / B)
        y = inputs.step_targets(y, B, T, K, self.dtype if self.loss == "mse" else None)
        counted = np.ones((T, B), dtype=bool) if lengths is None else (
            np.arange(T)[:, None] < to_host(lengths)[None, :])
        y = np.ascontiguousarray(np.swapaxes(y, 0, 1))        # time-major (T, B[, K])
        if self.loss == "xent":
            counted &= y >= 0
        N = int(counted.sum())
        if N == 0:
            raise ValueError("no step of y counts: every label is -1 or past its row's length")
        return y.reshape((T * B,) + y.shape[2:]), counted.reshape(T * B) / N

    # -- forward / backward ----------------------------------------------------------------------
    def kernels_for(self, B, T):
        """On cuda, the kernels each pass runs on batches of B rows and T steps (an
        autotune.Choice): `gpu_version`'s, or for "auto" the fastest as timed on this GPU."""
        if self.device != "cuda":
            raise ValueError("kernels_for: this model is on the cpu, which has one version")
        return self.tuner.choose(self, B, T, self.gpu_version)

    def backend_for(self, xt, lengths=None):
        """The backend (nprnn/core/backends.py) that runs the passes over time-major x (T, B, m)
        (with `lengths`, not None, for rows of their own lengths). On cuda the persistent and
        split kernels take neither lengths nor gradients at every step (a readout at every step,
        a layer above): the passes that need them run the step kernels, as a warning says once."""
        if self.device == "cpu":
            return CPU
        choice = self.kernels_for(xt.shape[1], xt.shape[0])
        forward, backward = choice.forward, choice.backward
        needs = [why for why, yes in (("lengths", lengths is not None),
                                      ("a readout at every step", self.readout == "every"),
                                      (f"{self.layers} layers", self.layers > 1)) if yes]
        if needs and backward.version != "step":
            self._warn_once(f"{', '.join(needs)}: BPTT runs the step kernels, not "
                            f"'{backward}' (the persistent and split kernels take neither "
                            f"lengths nor gradients at every step)")
            backward = backends.Kernels("step")
        if lengths is not None and forward.version != "step":
            forward = backends.Kernels("step")
        return CUDA(self.launch, forward, backward)

    def _warn_once(self, message):
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, stacklevel=3)

    def _prepare(self, x, lengths):
        """(time-major x, lengths on the device, backend) for a call on x (B, T, m)."""
        xt = self._check_x(x)
        lengths = self._check_lengths(lengths, xt)
        return xt, lengths, self.backend_for(xt, lengths)

    def hidden(self, x, lengths=None):
        """h_T (B, n) of the top layer for x (B, T, m): each row's state at its last step."""
        xt, lengths, be = self._prepare(x, lengths)
        caches = self._layers_forward(be, be.upload(xt, self.dtype, self._uploads, "x"), lengths)
        return be.to_host(caches[-1]["hs"][xt.shape[0]])

    def forward(self, x, lengths=None):
        """The readout's outputs for x (B, T, m) (and lengths (B,) in [1, T], None: all T):
        logits (loss "xent") or the predicted values (loss "mse"), (B, K) from each row's last
        step, or with readout "every" (B, T, K), 0 past a row's length."""
        xt, lengths, be = self._prepare(x, lengths)
        out = be.to_host(self.logits_on(be, xt, lengths))
        if self.readout == "last":
            return out
        T, B = xt.shape[:2]
        out = np.ascontiguousarray(out.reshape(T, B, -1).swapaxes(0, 1))
        if lengths is not None:
            out[np.arange(T)[None, :] >= to_host(lengths)[:, None]] = 0
        return out

    def _layers_forward(self, be, x, lengths):
        """Every layer's forward pass over time-major x on the device, each reading the hidden
        sequence of the one below; returns their caches."""
        caches = []
        for k in range(self.layers):
            _, cache = self.cell.forward(self.cell_params(k), x, None, self._layer_ws[k],
                                         backend=be, lengths=lengths, **self.hyper)
            caches.append(cache)
            x = cache["hs"][1:]
        return caches

    def _readout_rows(self, hs):
        """What the readout reads, from the top layer's states hs (T+1, B, n): h_T (B, n), or
        h_1 .. h_T as (T*B, n) rows."""
        T, B, n = hs.shape[0] - 1, hs.shape[1], hs.shape[2]
        return hs[T] if self.readout == "last" else hs[1:].reshape(T * B, n)

    def logits_on(self, be, xt, lengths=None):
        """The readout's outputs (R, K) for time-major x (T, B, m) on the backend `be`, left
        where they were computed (R = B, or T*B time-major rows with readout "every")."""
        x = be.upload(xt, self.dtype, self._uploads, "x")
        H = self._readout_rows(self._layers_forward(be, x, lengths)[-1]["hs"])
        logits = be.buffer(self._outputs, "logits", (H.shape[0], self.num_classes), self.dtype)
        be.run(K_readout.readout_forward, logits, H, self.params["W_out"],
               self.params["b_out"])
        return logits

    def loss_and_grad(self, x, y, lengths=None, return_logits=False):
        """The loss and its gradient w.r.t. every parameter (full BPTT). The loss is the mean
        softmax cross-entropy (loss "xent"; labels y (B,), or (B, T) with readout "every", -1
        for a step without loss) or the mean squared error (loss "mse"; targets y (B, K), or
        (B, T, K)), over the entries counted: steps past a row's length (lengths (B,) in
        [1, T]; None: all T) do not count. Returns (loss, grads[, outputs]), outputs being the
        readout's (R, K) rows (Step); grads has the same keys as params."""
        xt, lengths, be = self._prepare(x, lengths)
        step = self.step_on(be, xt, y, out=None, lengths=lengths)
        outputs = be.to_host(step.outputs)
        return (step.loss(), step.grads, outputs) if return_logits else (step.loss(), step.grads)

    def step_arrays(self, x, y, lengths=None):
        """What `loss_and_grad` computes, left where it was computed (device arrays on cuda, so
        that the caller need not wait for the GPU): a Step. On cuda all of it lives in the
        model's buffers and is overwritten by the next call (y, uploaded from the host, by the
        second next), the gradients included, so that a training step allocates no gradients on
        the GPU; `loss_and_grad` returns gradients of its own."""
        xt, lengths, be = self._prepare(x, lengths)
        return self.step_on(be, xt, y, out=self._layer_grads, lengths=lengths)

    def step_on(self, be, xt, y, out=None, lengths=None):
        """The training step's arrays (a Step) for time-major x (T, B, m), targets y and lengths
        (on the device; None: all T) on the backend `be`: every layer's forward pass, the
        readout, the loss, and BPTT from the loss to every parameter (the loss kernel is
        LOSS_KERNELS[self.loss]). The gradients go to the workspaces `out`, one per layer (None:
        fresh arrays)."""
        T, B = xt.shape[:2]
        if is_device_array(y) and self.readout == "last":
            weights = np.full(B, 1.0 / B)           # a device y is the loader's, checked there
        else:
            y, weights = self._rows(to_host(y), B, T, lengths)
        y = be.upload(y, self.dtype if self.loss == "mse" else np.int64, self._uploads, "y")
        weights = be.upload(weights, np.float64, self._uploads, "weights")
        x = be.upload(xt, self.dtype, self._uploads, "x")
        p, ws, dtype, K = self.params, self._workspace, self.dtype, self.num_classes
        out = out or [None] * self.layers
        caches = self._layers_forward(be, x, lengths)
        H = self._readout_rows(caches[-1]["hs"])
        R = H.shape[0]
        logits = be.buffer(self._outputs, "logits", (R, K), dtype)
        be.run(K_readout.readout_forward, logits, H, p["W_out"], p["b_out"])
        losses = be.buffer(self._outputs, "losses", (R,), dtype)
        dlogits = be.buffer(ws, "dlogits", (R, K), dtype)
        be.run(LOSS_KERNELS[self.loss], losses, dlogits, logits, y, weights)
        grads = dict(W_out=be.buffer(out[0], "dW_out", p["W_out"].shape, dtype),
                     b_out=be.buffer(out[0], "db_out", p["b_out"].shape, dtype))
        dH = be.buffer(ws, "dH", H.shape, dtype)
        be.run(K_readout.readout_backward, grads["W_out"], grads["b_out"], dH, dlogits, H,
               p["W_out"])
        # the top layer's gradient enters at its last step, or at every step; each layer below
        # gets dL/dx of the one above at every step
        dh_T, dhs = (dH, None) if self.readout == "last" else (None, dH.reshape(T, B, -1))
        for k in reversed(range(self.layers)):
            g, _ = self.cell.backward(self.cell_params(k), caches[k], dh_T, self._layer_ws[k],
                                      out[k], backend=be, dhs=dhs, **self.hyper)
            grads.update((name, g[key]) for name, key in self._names[k].items())
            if k > 0:
                dh_T, dhs = None, self.cell.input_grads(self.cell_params(k), caches[k],
                                                        self._layer_ws[k], backend=be)
        return Step(losses, grads, logits, y, weights)


def _integer(label, v, minimum):
    """v as a Python int >= minimum (NumPy integers accepted, bools not); ValueError otherwise."""
    if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or v < minimum:
        raise ValueError(f"{label} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _real(label, v):
    """v as a float; ValueError naming `label` when it is not a real number."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"{label} must be a number, got {v!r}")
    return float(v)


def check_hyper(key, spec, value, dtype):
    """The value of the hyperparameter `key` (declared by `spec`, a cells.Hyper) that a model of
    `dtype` computes with: spec.default for None, else `value` as a float, checked to be finite,
    in the spec's range and a number of the dtype (not rounded to 0 there where it must be
    > 0: a subnormal eps flushes eps * tanh(...) to 0 in the float32 kernels' BPTT)."""
    value = spec.default if value is None else _real(key, value)
    if not np.isfinite(value) or value < spec.minimum or (spec.above and value == spec.minimum):
        raise ValueError(f"{key} = {value!r} is not allowed: need {key} {spec.allowed}")
    with np.errstate(over="ignore"):                # said just below, with the value
        in_dtype = np.dtype(dtype).type(value)      # what the kernels compute with
    if not np.isfinite(in_dtype) or (spec.above and value > 0
                                     and in_dtype < np.finfo(dtype).tiny):
        how = ("overflows" if not np.isfinite(in_dtype) else
               "is subnormal" if in_dtype else "rounds to 0")
        raise ValueError(f"{key} = {value!r} is beyond {dtype}'s range "
                         f"({np.finfo(dtype).tiny:.3g} .. {np.finfo(dtype).max:.3g}): it "
                         f"{how} there")
    return value


def _output_size(loss, num_classes, output_size):
    """K, the readout's size: num_classes >= 2 (10 if not given) for "xent"; for "mse"
    num_classes or output_size, >= 1 (give one, or both alike)."""
    if loss == "xent":
        if output_size is not None:
            raise ValueError(f"output_size = {output_size!r} names the outputs of loss 'mse'; "
                             f"loss 'xent' takes num_classes")
        return _integer("num_classes", 10 if num_classes is None else num_classes, 2)
    if num_classes is None and output_size is None:
        raise ValueError("loss 'mse' needs the output size: give num_classes or output_size")
    sizes = [_integer(label, v, 1) for label, v in (("num_classes", num_classes),
                                                    ("output_size", output_size))
             if v is not None]
    if len(sizes) == 2 and sizes[0] != sizes[1]:
        raise ValueError(f"num_classes = {num_classes!r} and output_size = {output_size!r} "
                         f"differ: give one of them (for loss 'mse' both name the output size)")
    return sizes[0]


def _dtype_name(dtype):
    """"float32" or "float64" for any spelling NumPy understands (np.float32, "f4", float)."""
    try:
        name = None if dtype is None else np.dtype(dtype).name     # np.dtype(None) is float64
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return name


def make_model(name, input_size, hidden_size, num_classes=None, eps=None, gamma=None, sigma_w=1.0,
               init="paper", seed=0, dtype="float32", device="cpu", gate_bias=0.0, w_form=None,
               loss="xent", output_size=None, layers=1, readout="last", **hyper):
    """Build a model by name (see `nprnn.CELLS`), initialised as in Appendix C of the paper
    (`init="paper"`) or critically (`init="critical"`, LSTMs only; Gilboa et al. 2019, D.4).
    gate_bias starts the gate bias b_z of a gated Euler cell (eq. 13) at that value instead of
    Appendix C's 0: a deviation from the paper, as an LSTM's forget gate starts at 1.
    w_form holds W of the antisymmetric models (A = W - W^T - gamma I) strictly upper triangular
    ("triangle", the default: n(n-1)/2 parameters) or full ("full": n^2; cells.W_FORMS).
    loss: "xent", softmax cross-entropy over num_classes >= 2 classes (10 if not given), or "mse",
    the mean squared error of K >= 1 outputs, K given as num_classes or as output_size (one or
    the other; both must agree).
    layers: stacked layers of the cell, layer k + 1 reading layer k's hidden sequence (each
    initialised as the first, with input size n). readout: "last", the outputs from each row's
    last state; "every", from every step's (READOUTS).
    eps, gamma and the keywords in `hyper` (dt, epsilon, ...) are the cell's hyperparameters
    (`Cell.hyper`; None or left out: the cell's default): a model refuses one its cell does not
    have, and a value outside the range its cell declares."""
    if name not in CELLS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(CELLS)}")
    cell = CELLS[name].with_w_form(w_form)
    if not isinstance(loss, str) or loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if not isinstance(readout, str) or readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    layers = _integer("layers", layers, 1)
    input_size, hidden_size = (_integer(label, v, 1) for label, v in
                               (("input_size", input_size), ("hidden_size", hidden_size)))
    num_classes = _output_size(loss, num_classes, output_size)
    seed = _integer("seed", seed, 0)
    dtype = _dtype_name(dtype)
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    cell.check_init(init)
    sigma_w = _real("sigma_w", sigma_w)
    if not np.isfinite(sigma_w) or sigma_w < 0:
        raise ValueError(f"sigma_w must be a finite number >= 0, got {sigma_w!r}")
    if init == "critical" and sigma_w != 1.0:
        raise ValueError(f"sigma_w = {sigma_w!r} has no effect with init 'critical', whose "
                         f"variances are Gilboa et al.'s (D.4): leave sigma_w at 1")
    gate_bias = _real("gate_bias", gate_bias)
    with np.errstate(over="ignore"):
        if not np.isfinite(np.dtype(dtype).type(gate_bias)):
            raise ValueError(f"gate_bias must be a finite number in {dtype}'s range (largest "
                             f"{np.finfo(dtype).max:.3g}), got {gate_bias!r}")
    if gate_bias != 0.0 and "b_z" not in cell.shapes(1, 1):
        gated = ", ".join(k for k, c in CELLS.items() if "b_z" in c.shapes(1, 1))
        raise ValueError(f"gate_bias = {gate_bias!r} starts b_z, the gate bias of {gated}; "
                         f"model {name!r} has none: leave gate_bias at 0")
    given = dict(eps=eps, gamma=gamma, **hyper)
    for key, value in given.items():
        if value is not None and key not in cell.hyper:
            raise ValueError(f"model {name!r} has no hyperparameter {key!r} "
                             f"(it takes: {', '.join(cell.hyper) or 'none'})")
    hyper = {key: check_hyper(key, spec, given.get(key), dtype)
             for key, spec in cell.hyper.items()}
    device = resolve_device(device)            # DeviceUnavailable for "cuda" without a GPU
    rng = np.random.default_rng(seed)
    n, m, K = hidden_size, input_size, num_classes
    params = {}
    for k, names in enumerate(layer_names(cell, layers)):
        with np.errstate(over="ignore"):       # weights beyond the dtype are refused just below
            try:
                p = cell.init(rng, m if k == 0 else n, n, np.dtype(dtype), sigma_w=sigma_w,
                              scheme=init)
            except OverflowError:
                raise ValueError(f"sigma_w = {sigma_w!r} is too large: the variance of the "
                                 f"recurrent weights, sigma_w**2 / n, overflows a float") from None
        if gate_bias != 0.0:
            p["b_z"][:] = gate_bias           # z_t starts near sigmoid(gate_bias), not 1/2
        params.update((name, p[key]) for name, key in names.items())
    if not all(np.isfinite(p).all() for p in params.values()):
        raise ValueError(f"sigma_w = {sigma_w!r} draws initial weights beyond {dtype}'s range "
                         f"(largest {np.finfo(dtype).max:.3g})")
    # the readout: W_out ~ N(0, 1/n), b_out = 0 (Appendix C leaves it unspecified)
    params["W_out"] = gaussian(rng, (K, n), 1.0 / n, np.dtype(dtype))
    params["b_out"] = np.zeros(K, dtype=dtype)
    return Model(cell, m, n, K, params, hyper, dtype, device, sigma_w=sigma_w, init=init,
                 seed=seed, gate_bias=gate_bias, loss=loss, layers=layers, readout=readout)
