"""nprnn's cells as a PyTorch layer: forward and BPTT by nprnn's own kernels, not by autograd.

    from nprnn.torch import Recurrent
    rnn = Recurrent("antisym", input_size=m, hidden_size=n, num_layers=1, batch_first=True,
                    eps=0.01, gamma=0.01)          # any nprnn cell and its settings
    out, h_n = rnn(x, hx=None)                     # out (B, T, n) (batch_first), h_n (layers, B, n)
    out, h_n = rnn(x, lengths=lengths)             # or rnn(packed): a PackedSequence in, one out
    out, (h_n, c_n) = lstm(x, (h0, c0))            # the LSTMs, as nn.LSTM
    out, (y_n, z_n) = cornn(x, (y0, z0))           # coRNN and LEM: both states, as the LSTMs
    rnn = Recurrent(..., device="cuda")            # the GPU twins, on CUDA tensors

Each layer is one torch.autograd.Function: its forward runs the cell's forward kernels over the
whole sequence and keeps their cache; its backward runs the cell's BPTT with the gradient of
every output step (and of h_n, and of the second state's s_n: the LSTMs' c_n, coRNN's and LEM's
z_n), and hands back the gradients of x, of h_0 (and s_0) and of every parameter
(nprnn/core/cells.py: `forward`, `backward`, `input_grads`, `second_state`).
The parameters are nn.Parameters under nprnn's names (`W`, `V_h`, ..., `weight_ih_l0` for
several layers), drawn as make_model draws them from the same seed. CPU tensors are shared with
NumPy without copying (the kernels write into arrays that the returned tensors view); x is made
time-major once, as the kernels read it. Past a row's length the outputs are 0 and h_n holds
each row's last state, as pad_packed_sequence and nn.LSTM give them.

On CUDA (`_Device`) the tensors are numba device arrays' memory through
__cuda_array_interface__, with no copies either way, and the cell runs its GPU twins (version 1,
which takes lengths and a gradient at every step). This is the only module that imports torch,
and nothing in nprnn imports it.
"""
import numpy as np
import torch

from .core.backends import CPU, CUDA
from .core.device import cuda_available
from .core.memory import to_device
from .core.model import READOUT_NAMES, layer_names, make_model
from .kernels.gpu_common import cuda, simulator_enabled

DTYPES = {torch.float32: "float32", torch.float64: "float64"}


class _Host:
    """CPU tensors and the @njit twins: tensors are NumPy arrays' memory."""
    backend, tensor_device = CPU, "cpu"

    def array(self, t):
        """t's own memory as the kernels' array (t contiguous)."""
        return t.detach().numpy()

    def tensor(self, a):
        """A tensor over the kernels' array `a`, without copying."""
        return torch.from_numpy(np.asarray(a))

    def upload(self, a):
        return a

    def enter(self):
        """Before the kernels run: what leave() takes."""
        return None

    def leave(self, entered):
        pass


class _Device(_Host):
    """CUDA tensors and the GPU twins (version 1, which takes lengths and a gradient at every
    step): tensors and numba device arrays share memory through __cuda_array_interface__, both
    ways. The kernels run on the CUDA default stream, PyTorch's own unless told otherwise; under
    another PyTorch stream the default stream waits for it (an event, on the GPU: the host does
    not wait) and it waits in turn for the kernels, so that they run where PyTorch's work on that
    stream orders them. Under numba's CUDA simulator, which runs the GPU twins on the CPU, CPU
    tensors stand in for CUDA ones."""
    def __init__(self):
        self.simulated = simulator_enabled()
        self.tensor_device = "cpu" if self.simulated else "cuda"

    @property
    def backend(self):
        return CUDA()                        # with the launch settings of the moment

    def array(self, t):
        t = t.detach()
        if self.simulated:                   # the simulator's device arrays wrap NumPy arrays
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
            return FakeCUDAArray(t.numpy())
        return cuda.as_cuda_array(t, sync=False)

    def tensor(self, a):
        if self.simulated:
            return torch.from_numpy(a._ary)
        return torch.as_tensor(a, device="cuda")

    def upload(self, a):
        return to_device(a)

    def enter(self):
        """PyTorch's current stream as numba's, if it is not the default stream (None), after
        making the default stream wait for the work queued on it."""
        if self.simulated or torch.cuda.current_stream() == torch.cuda.default_stream():
            return None
        side = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        _wait(cuda.default_stream(), side)
        return side

    def leave(self, side):
        if side is not None:
            _wait(side, cuda.default_stream())        # its next work after the kernels


def _wait(stream, other):
    """Make `stream` wait, on the GPU, for the work queued on `other` so far."""
    done = cuda.event(timing=False)
    done.record(other)
    done.wait(stream)


class _Layer(torch.autograd.Function):
    """One layer over a time-major x (T, B, m): (outputs h_1 .. h_T (T, B, n), h_T (B, n)
    [, s_T]). s0 (B, n): the second state's s_0 (cells.Cell.second_state; None for 0, and for the
    cells without one)."""

    @staticmethod
    def forward(ctx, memory, cell, hyper, names, lengths, x, h0, s0, *params):
        m, be = memory, memory.backend
        entered = m.enter()
        p = {names[k]: m.array(v) for k, v in enumerate(params)}
        T = x.shape[0]
        s = cell.second_state
        given = {} if s0 is None else {f"{s}0": m.array(s0)}
        _, cache = cell.forward(p, m.array(x), m.array(h0), None, be, lengths=lengths, **hyper,
                                **given)
        m.leave(entered)
        ctx.memory, ctx.cell, ctx.hyper, ctx.names, ctx.p, ctx.cache = (m, cell, hyper, names, p,
                                                                       cache)
        hs = cache["hs"]
        outs = (m.tensor(hs[1:]), m.tensor(hs[T]))
        if s is not None:                           # s_T, differentiated as h_T
            outs += (m.tensor(cache[f"{s}s"][T]),)
        return outs

    @staticmethod
    def backward(ctx, d_out, d_h_T, *d_second):
        m, cell, cache, p = ctx.memory, ctx.cell, ctx.cache, ctx.p
        s = cell.second_state
        ds = {}
        if s is not None and d_second[0] is not None:          # dL/ds_T
            ds = {f"d{s}_T": m.array(d_second[0].contiguous())}
        entered = m.enter()
        grads, dh0 = cell.backward(p, cache, m.array(d_h_T.contiguous()),
                                   dhs=m.array(d_out.contiguous()), backend=m.backend,
                                   **ctx.hyper, **ds)
        dx = cell.input_grads(p, cache, backend=m.backend)
        m.leave(entered)
        ds0 = m.tensor(cache[f"d{s}0"]) if ctx.needs_input_grad[7] else None    # s0's
        return (None, None, None, None, None, m.tensor(dx), m.tensor(dh0), ds0,
                *(m.tensor(grads[name]) for name in ctx.names))


class Recurrent(torch.nn.Module):
    """`num_layers` layers of the nprnn cell `cell` as nn.RNN is used: see the module docstring.
    `settings` are the cell's own (eps, gamma, w_form, sigma_w, init, gate_bias, seed)."""

    def __init__(self, cell, input_size, hidden_size, num_layers=1, batch_first=True,
                 device=None, dtype=None, **settings):
        super().__init__()
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if dtype not in DTYPES:
            raise TypeError(f"dtype must be one of {', '.join(map(str, DTYPES))}, got {dtype}")
        self._on = _check_device(device)          # "cpu" or "cuda": where its kernels run
        model = make_model(cell, input_size, hidden_size, num_classes=2, layers=num_layers,
                           dtype=DTYPES[dtype], **settings)
        self.cell, self.hyper = model.cell, dict(model.hyper)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.num_layers, self.batch_first = num_layers, batch_first
        self._names = layer_names(model.cell, num_layers)     # {our name: the cell's}, per layer
        where = self._memory().tensor_device
        for name, value in model.params.items():
            if name not in READOUT_NAMES:
                self.register_parameter(name, torch.nn.Parameter(torch.from_numpy(value).to(where)))

    def _memory(self):
        """How tensors reach the kernels: the GPU twins for a layer on CUDA (its parameters
        moved there, or made with device="cuda"), else the CPU twins."""
        first = next(self.parameters(), None)
        if (first is not None and first.device.type == "cuda") or self._on == "cuda":
            _check_device("cuda")
            return _DEVICE
        return _HOST

    def forward(self, x, hx=None, lengths=None):
        """(out, h_n) for x (B, T, m) (batch_first; else (T, B, m)) or a PackedSequence;
        h_n (layers, B, n); for the LSTMs (h_n, c_n), for coRNN and LEM (y_n, z_n). hx
        (layers, B, n): h_0 (None: 0); for those cells also (h_0, c_0) or (y_0, z_0), either
        None for 0."""
        packed = isinstance(x, torch.nn.utils.rnn.PackedSequence)
        if packed:
            if lengths is not None:
                raise ValueError("give lengths or a PackedSequence, not both")
            x, lengths = torch.nn.utils.rnn.pad_packed_sequence(x, batch_first=self.batch_first)
        memory, where = self._memory(), self.W_device()
        if x.device != where:
            raise ValueError(f"x is on {x.device}; this layer's parameters are on {where}")
        if x.dtype != self.W_dtype():
            raise TypeError(f"x is {x.dtype}; this layer's parameters are {self.W_dtype()}")
        xt = (x.transpose(0, 1) if self.batch_first else x).contiguous()       # (T, B, m)
        T, B, _ = xt.shape
        if lengths is not None:
            lengths = np.asarray(torch.as_tensor(lengths).cpu(), dtype=np.int64)
            if lengths.shape != (B,) or lengths.min() < 1 or lengths.max() > T:
                raise ValueError(f"lengths must be (B,) = ({B},) ints in [1, {T}], got "
                                 f"{lengths.tolist()}")
            lengths = None if (lengths == T).all() else lengths
        kernel_lengths = None if lengths is None else memory.upload(lengths)
        h0, s0 = self._initial(hx, B, x.dtype, where)
        h_n, s_n = [], []
        for k in range(self.num_layers):
            names = self._names[k]
            params = [getattr(self, name) for name in names]
            outs = _Layer.apply(memory, self.cell, self.hyper, list(names.values()),
                                kernel_lengths, xt, h0[k], None if s0 is None else s0[k], *params)
            xt = outs[0]
            h_n.append(outs[1])
            s_n += outs[2:]
        out = xt.transpose(0, 1) if self.batch_first else xt
        if lengths is not None:                     # 0 past a row's length, as pad_packed gives
            steps = (torch.arange(T, device=where)[:, None]
                     < torch.from_numpy(lengths).to(where)[None, :])                  # (T, B)
            out = out * (steps.T if self.batch_first else steps)[..., None].to(out.dtype)
        if packed:
            out = torch.nn.utils.rnn.pack_padded_sequence(
                out, torch.from_numpy(lengths if lengths is not None else np.full(B, T)),
                batch_first=self.batch_first, enforce_sorted=False)
        h_n = torch.stack(h_n)
        return (out, (h_n, torch.stack(s_n))) if s_n else (out, h_n)

    def W_dtype(self):
        return next(self.parameters()).dtype

    def W_device(self):
        return next(self.parameters()).device

    def _initial(self, hx, B, dtype, where):
        """(h_0, s_0) of each layer, (layers, B, n) each: from hx, h_0 zeros where not given,
        s_0 (the second state's: the LSTMs' c_0, coRNN's and LEM's z_0) None (the kernels' 0)
        unless given."""
        shape = (self.num_layers, B, self.hidden_size)
        s, s0 = self.cell.second_state, None
        if isinstance(hx, tuple):                   # (h_0, c_0), as nn.LSTM takes it
            if s is None:
                raise ValueError(f"hx for {self.cell.name} is h_0 alone (layers, B, n), not a "
                                 f"tuple: only the cells with a second state (the LSTMs, coRNN, "
                                 f"LEM) take (h_0, s_0)")
            if len(hx) != 2:
                raise ValueError(f"hx for {self.cell.name} is (h_0, {s}_0), got a tuple of "
                                 f"{len(hx)}")
            hx, s0 = hx
            s0 = None if s0 is None else self._state(f"{s}_0", s0, shape, dtype, where)
        h0 = (torch.zeros(shape, dtype=dtype, device=where) if hx is None
              else self._state("hx", hx, shape, dtype, where))
        return h0, s0

    @staticmethod
    def _state(label, v, shape, dtype, where):
        if tuple(v.shape) != shape or v.dtype != dtype:
            raise ValueError(f"{label} must be {dtype} of shape (layers, B, n) = {shape}, got "
                             f"{v.dtype} {tuple(v.shape)}")
        if v.device != where:
            raise ValueError(f"{label} is on {v.device}; this layer's parameters are on {where}")
        return v.contiguous()


_HOST, _DEVICE = _Host(), None


def _check_device(device):
    """"cpu" or "cuda" for a layer's `device` (None: the CPU); an error naming what runs
    where another device, or CUDA without a GPU (or numba's simulator), is asked for."""
    global _DEVICE
    kind = torch.device("cpu" if device is None else device).type
    if kind not in ("cpu", "cuda"):
        raise NotImplementedError(f"nprnn.torch runs on devices cpu and cuda, got {device}")
    if kind == "cuda":
        ok, why = cuda_available()
        if not ok:
            raise RuntimeError(f"device {device}: numba cannot run CUDA kernels here ({why})")
        _DEVICE = _DEVICE or _Device()
    return kind
