"""A model is a cell plus the readout: x (B, T, m) -> h_T (B, n) -> logits (B, K) -> loss.

The loss is softmax cross-entropy over K classes (loss="xent", labels y (B,)) or the mean squared
error of K real outputs (loss="mse", targets y (B, K)); the readout's outputs are the logits of
the one and the predictions of the other (nprnn/kernels/readout.py).

`Model.loss_and_grad` is full BPTT: the readout's backward gives dL/dh_T, the cell's backward
carries it through all T steps. Inputs are validated here, once, so the kernels can trust them.

The forward pass, the loss and BPTT are written once (`step_on`): a backend (nprnn/core/backends.py)
runs each kernel's CPU or GPU twin. On device "cuda" `params` and the gradients are numba device
arrays that stay on the GPU (`host_params()` copies the parameters out), while y, the loss, the
logits and h_T cross as NumPy values, as on the CPU; x may be a NumPy array or a device array
(`Task.batches(..., device="cuda")` makes batches on the GPU).
"""
import numpy as np

from . import autotune, backends, inputs
from .backends import CPU, CUDA, time_major
from .cells import CELLS, DEFAULT_EPS, DEFAULT_GAMMA, gaussian
from .device import DEVICES, resolve_device
from ..kernels import readout as K_readout
from .memory import (DeviceWorkspace, Staging, Workspace, is_device_array, memory_of, to_device,
                     to_host)

DTYPES = ("float32", "float64")
LOSSES = ("xent", "mse")            # softmax cross-entropy (classes), mean squared error (outputs)
# the loss kernels (twins) of each loss; each writes (losses (B,), d outputs (B, K)) from the
# readout's outputs and y
LOSS_KERNELS = {"xent": K_readout.softmax_xent, "mse": K_readout.mse}


def count_params(cell, m, n, K):
    """Parameters of a model: the cell's at input size m and n units (cell.num_params), and the
    readout's, W_out (K, n) and b_out (K,)."""
    return cell.num_params(m, n) + K * n + K


class Model:
    def __init__(self, cell, input_size, hidden_size, num_classes, params, hyper, dtype,
                 device="cpu", sigma_w=1.0, init="paper", seed=0, gate_bias=0.0, loss="xent"):
        self.cell = cell
        self.loss = loss                        # "xent" or "mse" (LOSSES)
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
        if device == "cuda":
            self.tuner = autotune.Tuner.for_this_gpu()
            params = {k: to_device(v) for k, v in params.items()}
            self._workspace = self._outputs = DeviceWorkspace()
            self._step_grads = DeviceWorkspace()
            self._uploads = Staging()           # host x and y, copied without waiting for the GPU
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

    @property
    def name(self):
        return self.cell.name

    def num_params(self):
        return count_params(self.cell, self.input_size, self.hidden_size, self.num_classes)

    def cell_params(self):
        return {k: v for k, v in self.params.items() if k not in ("W_out", "b_out")}

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

    def _check_y(self, y, B):
        """y as the loss kernel reads it: labels (B,) int64 for "xent", targets (B, K) of the
        model's dtype for "mse"."""
        if self.loss == "mse":
            return inputs.targets(y, B, self.num_classes, self.dtype)
        return inputs.labels(y, B, self.num_classes)

    # -- forward / backward ----------------------------------------------------------------------
    def kernels_for(self, B, T):
        """On cuda, the kernels each pass runs on batches of B rows and T steps (an
        autotune.Choice): `gpu_version`'s, or for "auto" the fastest as timed on this GPU."""
        if self.device != "cuda":
            raise ValueError("kernels_for: this model is on the cpu, which has one version")
        return self.tuner.choose(self, B, T, self.gpu_version)

    def backend_for(self, xt):
        """The backend (nprnn/core/backends.py) that runs the passes over time-major x (T, B, m)."""
        if self.device == "cpu":
            return CPU
        choice = self.kernels_for(xt.shape[1], xt.shape[0])
        return CUDA(self.launch, choice.forward, choice.backward)

    def hidden(self, x):
        """h_T (B, n) for x (B, T, m)."""
        xt = self._check_x(x)
        be = self.backend_for(xt)
        x_on = be.upload(xt, self.dtype, self._uploads, "x")      # a host x copied to the GPU
        h_T, _ = self.cell.forward(self.cell_params(), x_on, None, self._workspace, backend=be,
                                   **self.hyper)
        return be.to_host(h_T)

    def forward(self, x):
        """The readout's outputs (B, K) for x (B, T, m): logits (loss "xent") or the predicted
        values (loss "mse")."""
        xt = self._check_x(x)
        be = self.backend_for(xt)
        return be.to_host(self.logits_on(be, xt))

    def logits_on(self, be, xt):
        """logits (B, K) for time-major x (T, B, m) on the backend `be`, left where they were
        computed."""
        x = be.upload(xt, self.dtype, self._uploads, "x")
        h_T, _ = self.cell.forward(self.cell_params(), x, None, self._workspace, backend=be,
                                   **self.hyper)
        logits = be.buffer(self._outputs, "logits", (h_T.shape[0], self.num_classes), self.dtype)
        be.run(K_readout.readout_forward, logits, h_T, self.params["W_out"],
               self.params["b_out"])
        return logits

    def loss_and_grad(self, x, y, return_logits=False):
        """The loss and its gradient w.r.t. every parameter (full BPTT): the mean softmax
        cross-entropy over the batch for labels y (B,) (loss "xent"), or the mean squared error
        over all B K outputs for targets y (B, K) (loss "mse"). Returns (loss, grads[, logits]),
        logits being the readout's outputs (B, K); grads has the same keys as params."""
        xt = self._check_x(x)
        be = self.backend_for(xt)
        losses, grads, logits, _ = self.step_on(be, xt, y, out=None)
        loss = float(be.to_host(losses).mean())
        return (loss, grads, be.to_host(logits)) if return_logits else (loss, grads)

    def step_arrays(self, x, y):
        """What `loss_and_grad` computes, left where it was computed (device arrays on cuda, so
        that the caller need not wait for the GPU): (losses (B,), grads, logits (B, K), y (B,)
        int64, or for loss "mse" y (B, K) of the model's dtype), with the mean of `losses` the
        loss. On cuda all of it lives in the model's buffers and is overwritten by the next call
        (y, uploaded from the host, by the second next), the gradients included, so that a
        training step allocates no gradients on the GPU; `loss_and_grad` returns gradients of its
        own."""
        xt = self._check_x(x)
        return self.step_on(self.backend_for(xt), xt, y, out=self._step_grads)

    def step_on(self, be, xt, y, out=None):
        """The training step's arrays (as step_arrays) for time-major x (T, B, m) and labels y on
        the backend `be`: the cell's forward pass, the readout, the loss, and BPTT from the loss
        to every parameter (the loss kernel is LOSS_KERNELS[self.loss]). The gradients go to the
        workspace `out` (None: fresh arrays)."""
        B = xt.shape[1]
        y = be.upload(self._check_y(y, B) if not is_device_array(y) else y,
                      self.dtype if self.loss == "mse" else np.int64, self._uploads, "y")
        x = be.upload(xt, self.dtype, self._uploads, "x")
        p, ws, dtype, K = self.params, self._workspace, self.dtype, self.num_classes
        h_T, cache = self.cell.forward(self.cell_params(), x, None, ws, backend=be, **self.hyper)
        logits = be.buffer(self._outputs, "logits", (B, K), dtype)
        be.run(K_readout.readout_forward, logits, h_T, p["W_out"], p["b_out"])
        losses = be.buffer(self._outputs, "losses", (B,), dtype)
        dlogits = be.buffer(ws, "dlogits", (B, K), dtype)
        be.run(LOSS_KERNELS[self.loss], losses, dlogits, logits, y)
        dW_out = be.buffer(out, "dW_out", p["W_out"].shape, dtype)
        db_out = be.buffer(out, "db_out", p["b_out"].shape, dtype)
        dh_T = be.buffer(ws, "dh_T", h_T.shape, dtype)
        be.run(K_readout.readout_backward, dW_out, db_out, dh_T, dlogits, h_T, p["W_out"])
        grads, _ = self.cell.backward(self.cell_params(), cache, dh_T, ws, out, backend=be,
                                      **self.hyper)
        grads.update(W_out=dW_out, b_out=db_out)
        return losses, grads, logits, y


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
               loss="xent", output_size=None):
    """Build a model by name (see `nprnn.CELLS`), initialised as in Appendix C of the paper
    (`init="paper"`) or critically (`init="critical"`, LSTMs only; Gilboa et al. 2019, D.4).
    gate_bias starts the gate bias b_z of a gated Euler cell (eq. 13) at that value instead of
    Appendix C's 0: a deviation from the paper, as an LSTM's forget gate starts at 1.
    w_form holds W of the antisymmetric models (A = W - W^T - gamma I) strictly upper triangular
    ("triangle", the default: n(n-1)/2 parameters) or full ("full": n^2; cells.W_FORMS).
    loss: "xent", softmax cross-entropy over num_classes >= 2 classes (10 if not given), or "mse",
    the mean squared error of K >= 1 outputs, K given as num_classes or as output_size (one or
    the other; both must agree)."""
    if name not in CELLS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(CELLS)}")
    cell = CELLS[name].with_w_form(w_form)
    if not isinstance(loss, str) or loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
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
    hyper = {}
    for key, value, default in (("eps", eps, DEFAULT_EPS), ("gamma", gamma, DEFAULT_GAMMA)):
        if key not in cell.hyper:
            if value is not None:
                raise ValueError(f"model {name!r} has no hyperparameter {key!r} "
                                 f"(it takes: {', '.join(cell.hyper) or 'none'})")
            continue
        value = default if value is None else _real(key, value)
        if not np.isfinite(value) or value < 0 or (key == "eps" and value == 0):
            allowed = "eps > 0" if key == "eps" else "gamma >= 0"
            raise ValueError(f"{key} = {value!r} is not allowed: need {allowed}")
        with np.errstate(over="ignore"):                # said just below, with the value
            in_dtype = np.dtype(dtype).type(value)      # what the kernels compute with
        if not np.isfinite(in_dtype) or (key == "eps" and in_dtype < np.finfo(dtype).tiny):
            # (a subnormal eps: eps * tanh(...) flushes to 0 in the float32 kernels' BPTT)
            how = ("overflows" if not np.isfinite(in_dtype) else
                   "is subnormal" if in_dtype else "rounds to 0")
            raise ValueError(f"{key} = {value!r} is beyond {dtype}'s range "
                             f"({np.finfo(dtype).tiny:.3g} .. {np.finfo(dtype).max:.3g}): it "
                             f"{how} there")
        hyper[key] = value
    device = resolve_device(device)            # DeviceUnavailable for "cuda" without a GPU
    rng = np.random.default_rng(seed)
    n, m, K = hidden_size, input_size, num_classes
    with np.errstate(over="ignore"):           # weights beyond the dtype are refused just below
        try:
            params = cell.init(rng, m, n, np.dtype(dtype), sigma_w=sigma_w, scheme=init)
        except OverflowError:
            raise ValueError(f"sigma_w = {sigma_w!r} is too large: the variance of the recurrent "
                             f"weights, sigma_w**2 / n, overflows a float") from None
    if gate_bias != 0.0:
        params["b_z"][:] = gate_bias          # z_t starts near sigmoid(gate_bias), not 1/2
    if not all(np.isfinite(p).all() for p in params.values()):
        raise ValueError(f"sigma_w = {sigma_w!r} draws initial weights beyond {dtype}'s range "
                         f"(largest {np.finfo(dtype).max:.3g})")
    # the readout: W_out ~ N(0, 1/n), b_out = 0 (Appendix C leaves it unspecified)
    params["W_out"] = gaussian(rng, (K, n), 1.0 / n, np.dtype(dtype))
    params["b_out"] = np.zeros(K, dtype=dtype)
    return Model(cell, m, n, K, params, hyper, dtype, device, sigma_w=sigma_w, init=init,
                 seed=seed, gate_bias=gate_bias, loss=loss)
