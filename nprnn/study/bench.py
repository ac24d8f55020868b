"""Timing of the kernels against PyTorch, measured in the same process: what `cli.py bench` prints.

Each measurement runs the call once to warm up (compilation, caches), then `repeat` times, and
reports the median: of the wall time on the CPU; on the GPU, of CUDA events around nprnn's
launches (nprnn.core.autotune.time_model) and of the wall time up to torch.cuda.synchronize() for
PyTorch.
"forward" is model.forward (cell + readout); "fwd+bwd" is model.loss_and_grad (forward, loss,
full BPTT). The PyTorch side does the same work: the cell, the readout, cross-entropy, and
`loss.backward()`; with `layers` stacked layers (nn.LSTM's num_layers) and with readout "every"
a readout and cross-entropy at every step (y (B, T)), as make_model's options. Both sides get the same batch: x (B, T, m) uniform on [0, 1), as pixels are,
and y (`bench_inputs`), batch-first as a task yields it, so each side's own change of layout is
timed too.

GFLOP/s is that of the forward+backward pass, counting the matrix products only (the elementwise
work is small beside them), summed over the layers (input size m for the first, n above it):

    forward   2 T B n (k_rec n + k_in m)          k_rec, k_in = n-wide blocks of the recurrent and
    backward  2 T B n (2 k_rec n + k_in m)        input products (1 for antisym, 4 for lstm, ...)

In float32, subnormal numbers are flushed to zero on both sides (`torch.set_flush_denormal(True)`
while PyTorch is timed; nprnn's kernels flush float32 subnormal gradients, see
`kernels/common.py`): without it, PyTorch's LSTM backward at T = 784 runs over ten times slower,
which would flatter nprnn. In float64 neither side flushes. The mode is set back afterwards, so
nprnn's later rows are timed as the first.

PyTorch is an optional yardstick (`pip install -e '.[bench]'`); nprnn never imports it elsewhere.
"""
import os
import time

import numba
import numpy as np

from ..core import autotune
from ..core.cells import CELLS, DEFAULT_EPS, DEFAULT_GAMMA, EulerCell
from ..core.device import cpu_model
from ..core.model import make_model

# (k_rec, k_in): how many n-wide blocks the recurrent and the input products have
def flops(name, B, T, m, n, layers=1):
    """(forward, forward + backward) matrix-product FLOPs of one batch (the cell's
    `product_blocks`: n-wide blocks of its recurrent and input products), over its layers."""
    k_rec, k_in = CELLS[name].product_blocks
    fwd = bwd = 0
    for k in range(layers):
        inputs = m if k == 0 else n
        fwd += 2 * T * B * n * (k_rec * n + k_in * inputs)
        bwd += 2 * T * B * n * (2 * k_rec * n + k_in * inputs)
    return fwd, fwd + bwd


def median_time(fn, repeat, sync=None, warmup=True):
    """Median wall time of fn() over `repeat` runs, after one warm-up run (compilation, caches)
    unless warmup=False. `sync` waits for queued GPU work, so that a run's time is the work's,
    not its launch's."""
    sync = sync or (lambda: None)
    if warmup:
        fn()
        sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def machine():
    return f"{cpu_model()}, {os.cpu_count()} cores"


def bench_inputs(B, T, m, dtype, seed=0, K=10, readout="last"):
    """The batch every contender gets: x (B, T, m) of `dtype`, uniform on [0, 1), and int64
    labels in 0 .. K-1, y (B,), or (B, T) for a readout at every step."""
    rng = np.random.default_rng(seed)
    x = rng.random((B, T, m), dtype=np.float32).astype(dtype)
    return x, rng.integers(0, K, size=B if readout == "last" else (B, T))


def bench_nprnn(name, x, y, n, repeat, seed=0, layers=1, readout="last"):
    """nprnn's model `name` of n units (and `layers`, `readout`), on the CPU, in x's dtype."""
    model = make_model(name, x.shape[2], n, 10, dtype=x.dtype, seed=seed, layers=layers,
                       readout=readout)
    return dict(forward=median_time(lambda: model.forward(x), repeat),
                fwd_bwd=median_time(lambda: model.loss_and_grad(x, y), repeat))


def torch_available(device="cpu"):
    """Whether PyTorch is installed and, for device "cuda", built with CUDA and seeing a GPU."""
    try:
        import torch
    except ImportError:
        return False
    return device == "cpu" or torch.cuda.is_available()


def _parameters(torch, gen, dtype, device, draw):
    """param(*shape, scale=1.0): a tensor of `shape` on `device` that autograd differentiates,
    drawn from gen as scale * N(0, 1) (draw "normal") or scale * U(-1, 1) ("uniform")."""
    def param(*shape, scale=1.0):
        if draw == "normal":
            w = torch.randn(*shape, generator=gen, dtype=dtype)
        else:
            w = torch.rand(*shape, generator=gen, dtype=dtype) * 2 - 1
        return (w * scale).to(device).requires_grad_()
    return param


def _torch_euler(cell, torch, n, m, eps, gamma, dtype, gen, device="cpu"):
    """The Euler-family cell written the fastest plain way in PyTorch: the input projection for all
    steps as one product, then a time loop of torch.addmm over its unbind(1), autograd for BPTT."""
    param = _parameters(torch, gen, dtype, device, "normal")
    W = param(n, n, scale=n ** -0.5)
    V_h, b_h = param(n, m), param(n, scale=0.0)
    gated = cell.gated
    V_z, b_z = (param(n, m), param(n, scale=0.0)) if gated else (None, None)
    eye = torch.eye(n, dtype=dtype, device=device)

    def hidden(x):              # x (B, T, m) -> h_1 .. h_T (B, T, n)
        if cell.antisymmetric:
            A = W.triu(1) - W.triu(1).T - gamma * eye
        elif cell.diffusion:
            A = W - gamma * eye
        else:
            A = W
        B, T, _ = x.shape
        U = torch.addmm(b_h, x.reshape(B * T, m), V_h.T).reshape(B, T, n)
        Z = torch.addmm(b_z, x.reshape(B * T, m), V_z.T).reshape(B, T, n) if gated else None
        h = torch.zeros(B, n, dtype=dtype, device=device)
        hs = []
        if gated and cell.kz:                       # eq. 13: the gate reads A h_{t-1} too
            for u, v in zip(U.unbind(1), Z.unbind(1)):
                Ah = h @ A.T
                h = h + eps * torch.sigmoid(Ah + v) * torch.tanh(Ah + u)
                hs.append(h)
        elif gated:                                 # antisym-xgate: every step's gate at once
            for u, g in zip(U.unbind(1), torch.sigmoid(Z).unbind(1)):
                h = h + eps * g * torch.tanh(torch.addmm(u, h, A.T))
                hs.append(h)
        else:
            for u in U.unbind(1):
                h = h + eps * torch.tanh(torch.addmm(u, h, A.T))
                hs.append(h)
        return torch.stack(hs, dim=1)
    hidden.params = [W, V_h, b_h] + ([V_z, b_z] if gated else [])
    return hidden


def _torch_cornn(cell, torch, n, m, dtype, gen, device="cpu"):
    """coRNN (kernels/cornn.py) in plain PyTorch at the paper's sMNIST settings: the input
    projection V u_t + b for all steps as one product, then the official recurrence, two
    torch.addmm a step; z's step dt_z is dt, or dt / (1 + dt epsilon) in the IMEX form."""
    from ..core.successors import CORNN_DT as dt, CORNN_EPSILON as epsilon, CORNN_GAMMA as gamma
    dt_z = dt / (1.0 + dt * epsilon) if cell.imex else dt
    bound = (m + 2 * n) ** -0.5                    # the official nn.Linear(m + 2n, n)'s init
    param = _parameters(torch, gen, dtype, device, "uniform")
    W, W_z, V, b = (param(*shape, scale=bound) for shape in ((n, n), (n, n), (n, m), (n,)))

    def hidden(x):
        B, T, _ = x.shape
        U = torch.addmm(b, x.reshape(B * T, m), V.T).reshape(B, T, n)
        y = torch.zeros(B, n, dtype=dtype, device=device)
        z = torch.zeros_like(y)
        ys = []
        for u in U.unbind(1):
            s = torch.tanh(torch.addmm(torch.addmm(u, y, W.T), z, W_z.T))
            z = z + dt_z * (s - gamma * y - epsilon * z)
            y = y + dt * z
            ys.append(y)
        return torch.stack(ys, dim=1)
    hidden.params = [W, W_z, V, b]
    return hidden


def _torch_lem(torch, n, m, dtype, gen, device="cpu"):
    """LEM (kernels/lem.py) in plain PyTorch at the paper's sMNIST dt: the input products of
    all steps as one, then the official recurrence: y_{t-1}'s three blocks in one torch.addmm,
    z's update, z_t's product, y's update."""
    from ..core.successors import LEM_DT as dt

    param = _parameters(torch, gen, dtype, device, "uniform")     # nn.Linear's U(+-fan_in^-1/2)
    W_ih, b_ih = param(4 * n, m, scale=m ** -0.5), param(4 * n, scale=m ** -0.5)
    W_hh, b_hh = param(3 * n, n, scale=n ** -0.5), param(3 * n, scale=n ** -0.5)
    W_z, b_z = param(n, n, scale=n ** -0.5), param(n, scale=n ** -0.5)

    def hidden(x):
        B, T, _ = x.shape
        A = torch.addmm(b_ih, x.reshape(B * T, m), W_ih.T).reshape(B, T, 4 * n)
        y = torch.zeros(B, n, dtype=dtype, device=device)
        z = torch.zeros_like(y)
        ys = []
        for a in A.unbind(1):
            A1, A2, A3, A4 = a.chunk(4, 1)
            H1, H2, H3 = torch.addmm(b_hh, y, W_hh.T).chunk(3, 1)
            g_bar, g = dt * torch.sigmoid(A1 + H1), dt * torch.sigmoid(A2 + H2)
            z = (1 - g) * z + g * torch.tanh(A4 + H3)
            y = (1 - g_bar) * y + g_bar * torch.tanh(torch.addmm(b_z, z, W_z.T) + A3)
            ys.append(y)
        return torch.stack(ys, dim=1)
    hidden.params = [W_ih, b_ih, W_hh, b_hh, W_z, b_z]
    return hidden


def bench_torch(name, x, y, n, repeat, seed=0, device="cpu", layers=1, layer=False,
                step=False):
    """PyTorch doing the same work on `device` ("cpu" or "cuda") from the same batch x (B, T, m),
    y (B,) (or (B, T): a readout at every step) in x's dtype, with `layers` layers; None where
    PyTorch has no counterpart (peephole-lstm). On "cuda", rnn, lstm and gru are cuDNN's
    kernels. With `layer`, the cell is nprnn.torch.Recurrent instead (nprnn's kernels in a
    PyTorch model); with `step`, every fwd+bwd ends with a torch.optim.SGD step, as a training
    step does."""
    import torch
    dtype = x.dtype.name
    # PyTorch's fastest setting on the CPU in float32: gradients that die away over hundreds of
    # steps reach the subnormal range, where each operation is ~100x slower (nprnn's float32
    # kernels flush them too; its float64 kernels do not, nor does PyTorch then).
    torch.set_flush_denormal(dtype == "float32")
    try:
        return _bench_torch(torch, name, x, y, n, dtype, repeat, seed, device, layers, layer,
                            step)
    finally:
        torch.set_flush_denormal(False)     # the thread's mode, as numba's kernels found it


def _bench_torch(torch, name, x, y, n, dtype, repeat, seed, device, layers=1, layer=False,
                 step=False):
    tdtype = getattr(torch, dtype)
    m = x.shape[2]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)                   # the modules below draw from the global generator
    cell = CELLS[name]
    params = []                               # what the optimiser steps (with `step`)
    if layer:                                 # nprnn's kernels as a PyTorch layer
        from ..torch import Recurrent
        rnn = Recurrent(name, m, n, num_layers=layers, dtype=tdtype, seed=seed, device=device)
        sequence = lambda x: rnn(x)[0]                                           # noqa: E731
        params = list(rnn.parameters())
    elif cell.torch_module:                   # nn.RNN, nn.LSTM, nn.GRU: the same weights
        module = getattr(torch.nn, cell.torch_module)(m, n, num_layers=layers, batch_first=True,
                                                       dtype=tdtype).to(device)
        sequence = lambda x: module(x)[0]                                        # noqa: E731
        params = list(module.parameters())
    elif isinstance(cell, EulerCell) or name in ("cornn", "cornn-imex", "lem"):
        # the cell nprnn's side builds (make_model's default eps and gamma, the successors'
        # sMNIST settings); layer k + 1 reads layer k's hidden sequence
        def one(k):
            inputs = m if k == 0 else n
            if name == "lem":
                return _torch_lem(torch, n, inputs, tdtype, gen, device)
            if name.startswith("cornn"):
                return _torch_cornn(cell, torch, n, inputs, tdtype, gen, device)
            return _torch_euler(cell, torch, n, inputs, DEFAULT_EPS, DEFAULT_GAMMA, tdtype, gen,
                                device)
        stack = [one(k) for k in range(layers)]

        def sequence(x):
            for one in stack:
                x = one(x)
            return x
        params = [p for one in stack for p in one.params]
    else:
        return None
    every = y.ndim == 2                       # a readout at every step
    readout = torch.nn.Linear(n, 10, dtype=tdtype).to(device)
    opt = torch.optim.SGD(params + list(readout.parameters()), lr=1e-3)
    x = torch.from_numpy(x).to(device)
    y = torch.from_numpy(y).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else None

    def outputs():
        h = sequence(x)
        return readout(h).flatten(0, 1) if every else readout(h[:, -1])

    def forward():
        with torch.no_grad():
            outputs()

    def fwd_bwd():
        torch.nn.functional.cross_entropy(outputs(), y.flatten()).backward()
        if step:
            opt.step()
            opt.zero_grad()
    return dict(forward=median_time(forward, repeat, sync),
                fwd_bwd=median_time(fwd_bwd, repeat, sync),
                threads=torch.get_num_threads(), version=torch.__version__)


def run(names, B, T, m, n, dtype="float32", repeat=5, with_torch=True, seed=0, layers=1,
        readout="last", torch_layer=False, device="cpu"):
    """Measure each model (of `layers` layers, read at the last step or every step), and PyTorch
    beside it where installed. Returns a list of rows. With `torch_layer`, training steps in
    PyTorch instead: nprnn.torch.Recurrent against the plain PyTorch cell, both with an SGD
    step, on `device` ("cpu" or "cuda")."""
    if torch_layer:
        return run_torch_layer(names, B, T, m, n, dtype, repeat, seed, layers, readout, device)
    rows = []
    x, y = bench_inputs(B, T, m, dtype, seed, readout=readout)
    for name in names:
        f_all = flops(name, B, T, m, n, layers)[1]
        ours = bench_nprnn(name, x, y, n, repeat, seed, layers=layers, readout=readout)
        theirs = (bench_torch(name, x, y, n, repeat, seed, layers=layers) if with_torch
                  else None)
        row = dict(model=name, impl=f"nprnn (numba, {threads(numba.get_num_threads())})", **ours,
                   gflops=f_all / ours["fwd_bwd"] / 1e9)
        if theirs is not None:
            row["ratio"] = ours["fwd_bwd"] / theirs["fwd_bwd"]
            rows.append(row)
            rows.append(dict(model=name, impl=f"PyTorch {theirs['version']} "
                             f"({threads(theirs['threads'])})", forward=theirs["forward"],
                             fwd_bwd=theirs["fwd_bwd"], gflops=f_all / theirs["fwd_bwd"] / 1e9,
                             ratio=1.0))
        else:
            if with_torch:
                row["note"] = "(PyTorch has no such cell)"
            rows.append(row)
    return rows


def run_torch_layer(names, B, T, m, n, dtype, repeat, seed, layers, readout, device="cpu"):
    """A PyTorch training step (forward, loss, backward, torch.optim.SGD) with the cell as
    nprnn.torch.Recurrent, beside the same step with the plain PyTorch cell (nn.RNN/LSTM/GRU, or
    the Euler cells' loop), both on `device`: rows as `run`'s, the ratio the layer's over the
    plain one's."""
    rows = []
    x, y = bench_inputs(B, T, m, dtype, seed, readout=readout)
    for name in names:
        f_all = flops(name, B, T, m, n, layers)[1]
        ours = bench_torch(name, x, y, n, repeat, seed, device, layers, layer=True, step=True)
        theirs = bench_torch(name, x, y, n, repeat, seed, device, layers, step=True)
        where = "cuda" if device == "cuda" else threads(numba.get_num_threads())
        rows.append(dict(model=name, impl=f"nprnn.torch in PyTorch {ours['version']} "
                         f"({where})", forward=ours["forward"],
                         fwd_bwd=ours["fwd_bwd"], gflops=f_all / ours["fwd_bwd"] / 1e9))
        if theirs is None:
            rows[-1]["note"] = "(PyTorch has no such cell)"
            continue
        rows[-1]["ratio"] = ours["fwd_bwd"] / theirs["fwd_bwd"]
        where = "cuda" if device == "cuda" else threads(theirs["threads"])
        rows.append(dict(model=name, impl=f"PyTorch {theirs['version']} ({where})",
                         forward=theirs["forward"], fwd_bwd=theirs["fwd_bwd"],
                         gflops=f_all / theirs["fwd_bwd"] / 1e9, ratio=1.0))
    return rows


def threads(count):
    """"1 thread", "2 threads"."""
    return f"{count} thread" + ("" if count == 1 else "s")


def format_table(rows):
    """The rows as a fixed-width table, the implementation column as wide as its longest entry;
    a row's note, if any, follows it."""
    w = max([len("implementation")] + [len(r["impl"]) for r in rows])
    lines = [f"{'model':<14} {'implementation':<{w}} {'forward ms':>10} {'fwd+bwd ms':>10} "
             f"{'GFLOP/s':>8} {'fwd+bwd vs PyTorch':>18}"]
    def shown(value, form):                     # "-" for what was not measured (nan)
        return form.format(value) if value is not None and np.isfinite(value) else "-"
    for r in rows:
        note = f"  {r['note']}" if r.get("note") else ""
        lines.append(f"{r['model']:<14} {r['impl']:<{w}} "
                     f"{shown(r['forward'] * 1e3, '{:.1f}'):>10} "
                     f"{shown(r['fwd_bwd'] * 1e3, '{:.1f}'):>10} "
                     f"{shown(r.get('gflops'), '{:.1f}'):>8} "
                     f"{shown(r.get('ratio'), '{:.2f}x'):>18}{note}")
    return "\n".join(lines)


def run_gpu(names, B, T, m, n, dtype="float32", repeat=5, with_torch=True, seed=0, layers=1,
            readout="last"):
    """Each GPU kernel option of each model (nprnn.core.autotune.time_model, CUDA events; a note says
    which 'auto' runs on this GPU), and PyTorch on
    the same GPU in the same run: the same cell as an eager loop for the Euler family, cuDNN for
    rnn, lstm, gru. Also cuDNN nn.RNN (tanh) and nn.LSTM of the same size, the issue's yardsticks.
    Ratios are nprnn's time over the same model's PyTorch time."""
    rows = []
    x, y = bench_inputs(B, T, m, dtype, seed, readout=readout)
    for name in names:
        f_all = flops(name, B, T, m, n, layers)[1]
        theirs = (bench_torch(name, x, y, n, repeat, seed, device="cuda", layers=layers)
                  if with_torch else None)
        model = make_model(name, m, n, 10, seed=seed, dtype=dtype, device="cuda", layers=layers,
                           readout=readout)
        for r in autotune.time_model(model, x, y, repeats=repeat):
            row = dict(model=name, impl=f"nprnn cuda, {r['version']}", note=r["note"],
                       forward=r["forward_ms"] / 1e3, fwd_bwd=r["forward_backward_ms"] / 1e3)
            row["gflops"] = f_all / row["fwd_bwd"] / 1e9              # nan: not measured
            if theirs is not None:
                row["ratio"] = row["fwd_bwd"] / theirs["fwd_bwd"]
            elif with_torch and not row["note"]:
                row["note"] = "(PyTorch has no such cell)"
            rows.append(row)
        if theirs is not None:
            kind = "cuDNN" if CELLS[name].torch_module else "eager"
            rows.append(dict(model=name, impl=f"PyTorch {theirs['version']} {kind}",
                             forward=theirs["forward"], fwd_bwd=theirs["fwd_bwd"],
                             gflops=f_all / theirs["fwd_bwd"] / 1e9, ratio=1.0))
    if with_torch:
        for name in ("rnn", "lstm"):                 # cuDNN yardsticks of the same size
            if name not in names:
                t = bench_torch(name, x, y, n, repeat, seed, device="cuda", layers=layers)
                f_all = flops(name, B, T, m, n, layers)[1]
                rows.append(dict(model=name, impl=f"PyTorch {t['version']} cuDNN",
                                 forward=t["forward"], fwd_bwd=t["fwd_bwd"],
                                 gflops=f_all / t["fwd_bwd"] / 1e9, ratio=1.0))
    return rows
