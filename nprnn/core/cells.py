"""The cell registry: one spec per cell, and everything else reads it. Each entry of `CELLS`
knows:

    shapes(m, n)            parameter name -> shape (the names of docs/models.md's table)
    num_params(m, n)        trainable scalars (W of the antisymmetric models counts n(n-1)/2)
    count(m, n)             the same, as a formula of m and n declared by hand from the cell's
                            equations (tests/test_cells.py holds num_params and the arrays a
                            model is made with to it, for every registered cell)
    init(rng, m, n, ...)    parameters at initialisation (Appendix C, or the critical one)
    hyper                   its hyperparameters, {name: Hyper} (eps, gamma of the Euler cells;
                            dt, gamma, epsilon of coRNN): each one's default and range, which
                            make_model checks; its passes take them as keyword arguments of
                            those names, and a run's config.json records them
    forward(p, x, h0, ws, backend, lengths)   its kernels over a time-major x (T, B, m) ->
                            (h_T, cache), on the CPU or, with a backends.CUDA, the GPU: written
                            once; cache["hs"] (T+1, B, n) holds h_0 .. h_T, and with lengths
                            (B,) row b's state stops changing after its step lengths[b]
    backward(p, cache, dh_T, ws, out, backend, dhs) -> (grads, dh_0), grads with the keys of p;
                            dhs (T, B, n), dL/dh_t from outside the recurrence (None: none), and
                            dh_T None for zero
    forward_kernels, backward_kernels   its kernels' twins (kernels.common.Twins)
    input_weights           (scratch, matrix) of each product by which x_t enters: BPTT leaves
                            dL/du_t of u_t = matrix x_t in cache[scratch], and `input_grads`
                            gives dL/dx from them (what a stacked layer hands the one below)
    persistent_layouts(n, dtype, backward, rows)   which persistent GPU passes fit
    split_lanes(n, dtype)   the lanes per unit with which split GPU passes fit (none: [])
    reference               its float64 oracle in nprnn/core/reference.py (forward, backward), same
                            contract but batch-major x (B, T, m)
    product_blocks          n-wide blocks of its recurrent and input products (bench's FLOPs)
    torch_module            the torch.nn module with the same weights, if any (bench)
    grad_mask(name, n)      None, or a 0/1 array that the gradient of `name` already respects
                            (the strict upper triangle of an antisymmetric W)
    sigmoid_gates           the cell's gates, values in (0, 1) that open and close: ("z",) of
                            eq. 13, ("i", "f", "o") of the LSTMs, ("r", "z") of the GRU
    gate_values(cache)      {gate: its values at every step, (T, B, n)}, views into a forward's
                            cache (what `analysis.gate_statistics` reads)
    ignores_h0(p)           whether h_1 (and so h_T) is the same whatever h_0 is: dh_T/dh_0 is
                            then exactly 0, not a product too small for the dtype

The tests, the model, bench, gates and jacobian iterate over `CELLS`: a cell registered is a cell
checked (tests/test_extra_cell.py registers one from a spec alone). A new cell of a family here
is its reference functions and one `register(...)` line; a new family adds its kernels file and a
spec class (`forward`, `backward`, `count`, `persistent_layouts` beside the rest), as
tests/extra_family/ does in three files that tests/test_extra_family.py registers.
"""
import copy
from dataclasses import dataclass

import numpy as np

from . import reference
from .backends import CPU
# each family's twins: the teaching file's, with the fast versions added (2, persistent; and 3,
# split, for the Euler cells and rnn); coRNN's and LEM's are their teaching files' (version 1)
from ..kernels.fast import antisym as K_euler
from ..kernels.fast import gru as K_gru
from ..kernels.fast import lstm as K_lstm
from ..kernels.fast import rnn as K_rnn
from ..kernels import stack as K_stack
from ..kernels.gpu_common import SHARED_BYTES_MAX, split_lanes

# Appendix C grid: eps in {0.01, 0.1, 1}, gamma in {0.001, 0.01, 0.1, 1}, sigma_w in
# {0, 1, 2, 4, 8, 16}. The defaults below are points of that grid.
DEFAULT_EPS = 0.01
DEFAULT_GAMMA = 0.01
INIT_SCHEMES = ("paper", "critical")      # every scheme; each cell lists its own in init_schemes
# How the antisymmetric cells hold W in A = W - W^T - gamma I: "triangle", W strictly upper
# triangular (n(n-1)/2 parameters, the paper's count, and the default); "full", a full n x n W
# (the paper's W_h in R^{n x n}, as public re-implementations hold it). Under the same lr a full W
# moves A twice as far per step (A's gradient reaches both W_ij and W_ji), and Appendix C's
# N(0, sigma_w^2 / n) gives A twice the variance: not the same model under SGD.
W_FORMS = ("triangle", "full")


@dataclass(frozen=True)
class Hyper:
    """One hyperparameter of a cell, declared once: its default, the values it may take (finite,
    and >= minimum, or > minimum where `above`) and what it is (the help of the CLI option of
    its name). make_model checks a value by it (`model.check_hyper`); cells that share a name
    may mean different things by it (gamma: the Euler cells' diffusion, coRNN's restoring force),
    each with its own default."""
    default: float
    minimum: float = 0.0
    above: bool = False
    help: str = ""

    @property
    def allowed(self):
        """The range, as an error says it: "> 0", ">= 0"."""
        return f"{'>' if self.above else '>='} {self.minimum:g}"


# the Euler cells' two (Appendix C)
EPS = Hyper(DEFAULT_EPS, above=True,
            help="Step size eps of the Euler cells (Appendix C grid: 0.01, 0.1, 1)")
GAMMA = Hyper(DEFAULT_GAMMA, help="Diffusion gamma of the Euler cells (grid: 0.001, 0.01, 0.1, 1)")


def gaussian(rng, shape, var, dtype):
    """N(0, var) entries; var = 0 gives zeros (sigma_w = 0 is on the paper's grid)."""
    if var == 0:
        return np.zeros(shape, dtype=dtype)
    return (rng.standard_normal(shape) * np.sqrt(var)).astype(dtype)


class Cell:
    """Base class: the defaults that most cells share. Subclasses set `name`, `summary`,
    `hyper` ({name: Hyper} of what the cell reads) and implement the abstract methods."""

    name = ""
    summary = ""
    hyper = {}
    init_schemes = ("paper",)
    sigmoid_gates = ()
    reference = (None, None)     # its forward and backward in nprnn/core/reference.py
    product_blocks = (1, 1)      # n-wide blocks of its recurrent and input products (bench FLOPs)
    unfitting_layout = None      # the layout named when a persistent pass does not fit
    torch_module = None          # the torch.nn module with the same weights, if any (bench)
    w_forms = ()                 # the forms of W it may take (W_FORMS; the first the default)
    w_form = None                # the form this spec holds W in
    input_weights = (("da", "weight_ih"),)   # (scratch, matrix) of each product x_t enters
    # a second state s beside h (the LSTMs' c, coRNN's and LEM's z): its letter, if any. Such a
    # cell's forward takes s_0 as f"{s}0", keeps s_0 .. s_T in cache[f"{s}s"]; its backward takes
    # dL/ds_T as f"d{s}_T" and leaves dL/ds_0 in cache[f"d{s}0"]
    second_state = None

    def with_w_form(self, w_form):
        """This spec with W in the form `w_form` (one of `w_forms`; None: the default). The
        registry keeps the default form; a model made with another holds a copy."""
        if w_form is None or w_form == self.w_form:
            return self
        if not self.w_forms:
            having = ", ".join(k for k, c in CELLS.items() if c.w_forms)
            raise ValueError(f"w_form = {w_form!r} is the form of W in A = W - W^T of "
                             f"{having}; model {self.name!r} has no such W: leave w_form out")
        if w_form not in self.w_forms:
            raise ValueError(f"w_form must be one of {', '.join(self.w_forms)}, got {w_form!r}")
        variant = copy.copy(self)
        variant.w_form = w_form
        return variant

    def shapes(self, m, n):
        raise NotImplementedError

    def num_params(self, m, n):
        return int(sum(np.prod(s) for s in self.shapes(m, n).values()))

    def count(self, m, n):
        raise NotImplementedError

    def grad_mask(self, name, n):
        return None

    def check_init(self, scheme):
        """ValueError unless this cell has the initialisation `scheme`."""
        if scheme not in self.init_schemes:
            raise ValueError(f"init {scheme!r} is not available for model {self.name!r}; "
                             f"choose one of: {', '.join(self.init_schemes)}")

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        raise NotImplementedError

    # Each cell's passes take its hyperparameters (those `hyper` names) as keyword arguments of
    # those names, after these: EulerCell.forward(..., eps=, gamma=). A cell without any takes
    # none, and a model refuses them at make_model.
    def forward(self, p, x, h0=None, ws=None, backend=CPU, lengths=None):
        """(h_T, cache) over a time-major x (T, B, m), running the cell's kernels on `backend`;
        lengths (B,) in [1, T] (None: all T) stop each row's state after its own last step."""
        raise NotImplementedError

    def backward(self, p, cache, dh_T, ws=None, out=None, backend=CPU, dhs=None):
        """(grads, dh_0) from dL/dh_T (None: 0) and dhs (T, B, n), dL/dh_t entering at every
        step (None: none), by the kernels that undo `forward`'s."""
        raise NotImplementedError

    def input_grads(self, p, cache, ws=None, backend=CPU):
        """dL/dx (T, B, m) after `backward` has run on `cache`: x_t enters only through the
        products u_t = W x_t of `input_weights`, so dL/dx_t = sum of dL/du_t W
        (kernels/stack.py)."""
        x = cache["x"]
        dx = backend.buffer(ws, "dx", x.shape, x.dtype)
        for k, (scratch, matrix) in enumerate(self.input_weights):
            backend.run(K_stack.input_grad, dx, cache[scratch], p[matrix], k > 0)
        return dx

    def gate_values(self, cache):
        return {}

    def ignores_h0(self, p):
        """Whether h_1, and so every later h_t, is the same whatever h_0 is, for parameters `p`.
        Never, for a cell that carries h_{t-1} into h_t past its weights, as the Euler cells do
        (h_{t-1} + ...); the cells whose only path from h_{t-1} is a recurrent matrix say so."""
        return False

    def reference_forward(self, p, x, h0=None, **hyper):
        return self.reference[0](p, x, h0=h0, **hyper)

    def reference_backward(self, p, cache, dh_T, **hyper):
        return self.reference[1](p, cache, dh_T, **hyper)

    def persistent_layouts(self, n, dtype, backward, rows=1):
        """The matrix layouts with which a persistent GPU pass fits a block's shared memory at n
        units and `rows` batch rows per block ([None] for a cell with no layouts to choose;
        empty where not even the rows' state fits)."""
        raise NotImplementedError

    def split_lanes(self, n, dtype):
        """The lanes per unit with which this cell's split GPU kernels (version 3) run at n
        units: none where its twins have no split version (the LSTM's stacked W_hh does not
        fit a block's registers at the paper's sizes)."""
        return split_lanes(n, dtype) if self.forward_kernels.gpu_split else []


def gradients(backend, out, p, B, n, dtype):
    """Arrays for the gradients of the parameters p and for dh_0 (B, n): buffers of the
    workspace `out` (a training step's, reused), or fresh arrays when it is None."""
    g = {k: backend.buffer(out, f"d{k}", v.shape, v.dtype) for k, v in p.items()}
    return g, backend.buffer(out, "dh0", (B, n), dtype)


class EulerCell(Cell):
    """antisym (eq. 12), antisym-gated (eq. 13), ablation (section 5.4), feedback (section 4) and
    antisym-xgate: one forward-Euler step h_t = h_{t-1} + eps [z_t o] tanh(A h_{t-1} + V_h x_t +
    b_h), differing only in how the recurrent matrix A is made from W, whether the input gate
    z_t exists, and whether it reads A h_{t-1} (eq. 13) or x_t alone (antisym-xgate)."""

    hyper = {"eps": EPS, "gamma": GAMMA}

    unfitting_layout = "global"

    def __init__(self, name, summary, antisymmetric, gated, reference, uses_gamma=True,
                 gate_reads_h=True):
        self.name, self.summary, self.reference = name, summary, reference
        self.antisymmetric, self.gated = antisymmetric, gated
        self.w_forms = W_FORMS if antisymmetric else ()
        self.w_form = W_FORMS[0] if antisymmetric else None
        self.kz = 1.0 if gate_reads_h else 0.0     # the gate's share of A h_{t-1} (kernels)
        self.diffusion = uses_gamma               # A has -gamma I (always, if antisymmetric)
        self.hyper = {"eps": EPS, "gamma": GAMMA} if uses_gamma else {"eps": EPS}
        self.sigmoid_gates = ("z",) if gated else ()
        self.product_blocks = (1, 2 if gated else 1)
        self.input_weights = (("da", "V_h"), ("dzp", "V_z")) if gated else (("da", "V_h"),)
        # the kernels' twins (kernels/antisym.py), gated or not
        self.forward_kernels = K_euler.euler_gated_forward if gated else K_euler.euler_forward
        self.backward_kernels = K_euler.euler_gated_backward if gated else K_euler.euler_backward

    def shapes(self, m, n):
        s = dict(W=(n, n), V_h=(n, m), b_h=(n,))
        if self.gated:
            s.update(V_z=(n, m), b_z=(n,))
        return s

    def num_params(self, m, n):
        total = super().num_params(m, n)
        return total - n * (n + 1) // 2 if self.w_form == "triangle" else total

    def count(self, m, n):
        W = n * (n - 1) // 2 if self.w_form == "triangle" else n * n   # the strict upper triangle
        return W + (2 if self.gated else 1) * (n * m + n)              # V_h, b_h [, V_z, b_z]

    def grad_mask(self, name, n):
        if self.w_form == "triangle" and name == "W":
            return np.triu(np.ones((n, n)), k=1)
        return None

    def reference_backward(self, p, cache, dh_T, **hyper):
        if self.antisymmetric:
            hyper["w_form"] = self.w_form
        return super().reference_backward(p, cache, dh_T, **hyper)

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        self.check_init(scheme)
        # Appendix C: input-to-hidden N(0, 1/m), hidden-to-hidden N(0, sigma_w^2 / n), biases 0.
        p = dict(W=gaussian(rng, (n, n), sigma_w ** 2 / n, dtype),
                 V_h=gaussian(rng, (n, m), 1.0 / m, dtype),
                 b_h=np.zeros(n, dtype))
        if self.w_form == "triangle":
            # only the strict upper triangle is a parameter (n(n-1)/2 of them, the paper's count),
            # so each off-diagonal entry of W - W^T is one N(0, sigma_w^2 / n) draw (a full W
            # gives it two: variance 2 sigma_w^2 / n)
            p["W"] = np.triu(p["W"], k=1)
        if self.gated:
            p["V_z"] = gaussian(rng, (n, m), 1.0 / m, dtype)
            p["b_z"] = np.zeros(n, dtype)
        return p

    def persistent_layouts(self, n, dtype, backward, rows=1):
        return K_euler.persistent_layouts(n, dtype, self.antisymmetric, backward, rows)

    def matrix(self, W, gamma, ws=None, backend=CPU):
        """The recurrent matrix A that the kernels use: W - W^T - gamma I (antisym,
        antisym-gated, antisym-xgate), W - gamma I (ablation), W (feedback)."""
        if self.antisymmetric:
            A = backend.buffer(ws, "A", W.shape, W.dtype)
            backend.run(K_euler.antisym_matrix, A, W, gamma)
            return A
        if self.diffusion:
            A = backend.buffer(ws, "A", W.shape, W.dtype)
            backend.run(K_euler.shifted_matrix, A, W, gamma)
            return A
        return W

    def forward(self, p, x, h0=None, ws=None, backend=CPU, lengths=None, eps=DEFAULT_EPS,
                gamma=DEFAULT_GAMMA):
        T, B, _ = x.shape
        n = p["b_h"].shape[0]
        eps = backend.scalar(eps, x.dtype)
        A = self.matrix(p["W"], gamma, ws, backend)
        hs = backend.states(ws, "hs", x, n, h0)
        th = backend.buffer(ws, "th", (T, B, n), x.dtype)
        cache = dict(x=x, A=A, hs=hs, th=th, lengths=lengths)
        gate = ()
        if self.gated:
            cache["z"] = backend.buffer(ws, "z", (T, B, n), x.dtype)
            gate = (cache["z"],)
        inputs = (p["V_h"], p["b_h"]) + ((p["V_z"], p["b_z"]) if self.gated else ())
        kz = (backend.scalar(self.kz, x.dtype),) if self.gated else ()
        backend.run_pass(self.forward_kernels, False, hs, th, *gate, x, A, *inputs, eps, *kz,
                         sequence=backend.sequence(ws, x, n, lengths))
        return hs[T], cache

    def backward(self, p, cache, dh_T, ws=None, out=None, backend=CPU, dhs=None,
                 eps=DEFAULT_EPS, gamma=DEFAULT_GAMMA):
        x, A, hs, th = cache["x"], cache["A"], cache["hs"], cache["th"]
        T, B, _ = x.shape
        n = A.shape[0]
        eps = backend.scalar(eps, x.dtype)
        dh_T = backend.upstream(dh_T, hs)
        g, dh0 = gradients(backend, out, p, B, n, x.dtype)
        # the antisymmetric models turn dA into dW (below); the others' dW is dA itself
        dA = backend.buffer(ws, "dA", A.shape, A.dtype) if self.antisymmetric else g["W"]
        da = backend.buffer(ws, "da", (T, B, n), x.dtype)
        if self.gated:
            grads = (dA, g["V_h"], g["b_h"], g["V_z"], g["b_z"], dh0, da,
                     backend.buffer(ws, "dzp", (T, B, n), x.dtype),
                     backend.buffer(ws, "ds", (T, B, n), x.dtype))
            state = (dh_T, hs, th, cache["z"], x, A, eps, backend.scalar(self.kz, x.dtype))
        else:
            grads = (dA, g["V_h"], g["b_h"], dh0, da)
            state = (dh_T, hs, th, x, A, eps)
        backend.run_pass(self.backward_kernels, True, *grads, *state,
                         sequence=backend.sequence(ws, x, n, cache["lengths"], dhs, True))
        cache["da"] = da                    # for input_grads, with the gate's dzp
        if self.gated:
            cache["dzp"] = grads[-2]
        if self.antisymmetric:
            backend.run(K_euler.antisym_dW, g["W"], dA, self.w_form == "triangle")
        return g, dh0

    def gate_values(self, cache):
        return {"z": cache["z"]} if self.gated else {}


CELLS = {}


def register(cell):
    CELLS[cell.name] = cell
    return cell


def variants():
    """(label, name, make_model options) of every registered cell in its default form, then of
    each other form of W it takes ("antisym[w_form=full]"): what registry-driven tests check."""
    found = [(name, name, {}) for name in CELLS]
    for name, cell in CELLS.items():
        found += [(f"{name}[w_form={form}]", name, dict(w_form=form)) for form in cell.w_forms[1:]]
    return found


register(EulerCell("antisym", "AntisymmetricRNN, eq. (12)", antisymmetric=True, gated=False,
                   reference=(reference.antisym_forward, reference.antisym_backward)))
register(EulerCell("antisym-gated", "AntisymmetricRNN with gating, eq. (13)",
                   antisymmetric=True, gated=True,
                   reference=(reference.antisym_gated_forward, reference.antisym_gated_backward)))
register(EulerCell("ablation", "eq. (13) with an unstructured W (section 5.4)",
                   antisymmetric=False, gated=True,
                   reference=(reference.ablation_forward, reference.ablation_backward)))
register(EulerCell("feedback", "RNN with feedback, h + eps tanh(W h + V x + b) (section 4)",
                   antisymmetric=False, gated=False, uses_gamma=False,
                   reference=(reference.feedback_forward, reference.feedback_backward)))
register(EulerCell("antisym-xgate", "eq. (13) with a gate of x_t alone (not in the paper)",
                   antisymmetric=True, gated=True, gate_reads_h=False,
                   reference=(reference.antisym_xgate_forward, reference.antisym_gated_backward)))


# ----------------------------------------------------------------------------------------------
# Baselines: rnn, lstm, peephole-lstm, gru. Parameter names and layouts are PyTorch's single-layer
# nn.RNN / nn.LSTM / nn.GRU (gate blocks of n rows stacked in weight_ih (kn, m), weight_hh (kn, n),
# bias_ih (kn,), bias_hh (kn,)), so weights can be exchanged with PyTorch; both biases are kept and
# counted, as PyTorch counts them. None of these cells takes eps or gamma. For the LSTMs, `h0`
# sets h_0 only, the cell state always starts at c_0 = 0, and backward's dh_0 is dL/dh_0.
# ----------------------------------------------------------------------------------------------

def _stacked(rng, m, n, dtype, input_var, recurrent_var, bias_mean):
    """weight_ih, weight_hh, bias_ih, bias_hh for k = len(input_var) gate blocks of n rows each,
    stacked in the cell's gate order. Block k: weight_ih rows N(0, input_var[k]), weight_hh rows
    N(0, recurrent_var[k]), bias_ih = bias_mean[k] and bias_hh = 0, so that
    b_ih + b_hh = bias_mean[k]."""
    k = len(input_var)
    return dict(
        weight_ih=np.concatenate([gaussian(rng, (n, m), v, dtype) for v in input_var]),
        weight_hh=np.concatenate([gaussian(rng, (n, n), v, dtype) for v in recurrent_var]),
        bias_ih=np.repeat(np.asarray(bias_mean, dtype=dtype), n),
        bias_hh=np.zeros(k * n, dtype=dtype))


class StackedGateCell(Cell):
    """What rnn, lstm, peephole-lstm and gru share: PyTorch's stacked layout, no
    hyperparameters, and the paper's initialisation (Appendix C): input-to-hidden N(0, 1/m),
    hidden-to-hidden N(0, sigma_w^2 / n), biases 0 except an LSTM's forget gate bias, which is 1
    (held in bias_ih's f block; bias_hh's f block is 0, so their sum is 1)."""

    hyper = {}
    gates = ("h",)              # the gate blocks, in PyTorch's order
    forget_gate = None          # the block whose bias starts at 1 in the paper scheme

    def __init__(self, name, summary, kernels_module, reference):
        self.name, self.summary, self.reference = name, summary, reference
        self.kernels_module = kernels_module      # for its FORWARD_VALUES, BACKWARD_VALUES
        self.product_blocks = (len(self.gates), len(self.gates))

    def persistent_layouts(self, n, dtype, backward, rows=1):
        # the persistent kernels keep VALUES vectors of n per row in shared memory and read W_hh
        # from global memory: one layout, where the state fits
        K = self.kernels_module
        values = K.BACKWARD_VALUES if backward else K.FORWARD_VALUES
        fits = values * n * rows * np.dtype(dtype).itemsize <= SHARED_BYTES_MAX
        return [None] if fits else []

    def shapes(self, m, n):
        k = len(self.gates)
        return dict(weight_ih=(k * n, m), weight_hh=(k * n, n), bias_ih=(k * n,),
                    bias_hh=(k * n,))

    def count(self, m, n):
        return len(self.gates) * (n * m + n * n + 2 * n)   # per gate: W_ih, W_hh, b_ih, b_hh

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        self.check_init(scheme)
        if scheme == "critical":
            return self.critical_init(rng, m, n, dtype)
        k = len(self.gates)
        bias = [1.0 if gate == self.forget_gate else 0.0 for gate in self.gates]
        return _stacked(rng, m, n, dtype, [1.0 / m] * k, [sigma_w ** 2 / n] * k, bias)

    def critical_init(self, rng, m, n, dtype):
        raise NotImplementedError(f"model {self.name!r} has no critical initialisation")

    def gate_values(self, cache):
        # the forward kernels store the activated blocks, gates[t] = (i, f, g, o) or (r, z, n)
        n = cache["hs"].shape[2]
        return {g: cache["gates"][:, :, k * n:(k + 1) * n] for k, g in enumerate(self.gates)
                if g in self.sigmoid_gates}

    def ignores_h0(self, p):
        # rnn and the LSTMs read h_{t-1} through weight_hh alone (the peepholes read c, and c_0 = 0
        # is fixed), so with weight_hh all 0 (sigma_w = 0) h_1 is a function of x_1 only
        return not np.any(p["weight_hh"])



class RNNCell(StackedGateCell):
    """h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)  (kernels/rnn.py)."""

    gates = ("h",)
    forward_kernels, backward_kernels = K_rnn.rnn_forward, K_rnn.rnn_backward
    torch_module = "RNN"

    def forward(self, p, x, h0=None, ws=None, backend=CPU, lengths=None):
        T = x.shape[0]
        n = p["weight_hh"].shape[1]
        hs = backend.states(ws, "hs", x, n, h0)
        backend.run_pass(self.forward_kernels, False, hs, x, p["weight_ih"], p["weight_hh"],
                         p["bias_ih"], p["bias_hh"], sequence=backend.sequence(ws, x, n, lengths))
        return hs[T], dict(x=x, hs=hs, lengths=lengths)

    def backward(self, p, cache, dh_T, ws=None, out=None, backend=CPU, dhs=None):
        x, hs = cache["x"], cache["hs"]
        T, B, _ = x.shape
        n = p["weight_hh"].shape[1]
        g, dh0 = gradients(backend, out, p, B, n, x.dtype)
        da = backend.buffer(ws, "da", (T, B, n), x.dtype)
        dh_T = backend.upstream(dh_T, hs)
        backend.run_pass(self.backward_kernels, True, g["weight_ih"], g["weight_hh"], g["bias_ih"],
                         g["bias_hh"], dh0, da, dh_T, hs, x, p["weight_hh"],
                         sequence=backend.sequence(ws, x, n, cache["lengths"], dhs, True))
        cache["da"] = da
        return g, dh0


class LSTMCell(StackedGateCell):
    """The LSTM, gates i, f, g, o, with or without peepholes w_ci, w_cf, w_co (kernels/lstm.py).

    init="paper": Appendix C (see StackedGateCell); the peephole vectors start at zero.
    init="critical": Gilboa et al. (2019), Appendix D.4. Their pre-activations are
    u_k = W_k s_{t-1} + U_k z_t + b_k with W_k ~ N(0, sigma_k^2 / N), U_k ~ N(0, nu_k^2 / N),
    b_k ~ N(mu_k, rho_k^2) (section 4.1), and their gate r is our candidate gate g. Here W_k is a
    block of weight_hh with variance sigma_k^2 / n, U_k a block of weight_ih with variance
    nu_k^2 / m (the paper takes the input size equal to N; we use m), b_k = mu_k sits in bias_ih
    (all rho_k^2 = 0, bias_hh = 0), and the peephole vectors are zero. There is no sigma_w
    (make_model refuses one other than 1).
    The paper's peephole LSTM feeds the cell state to the gates through full matrices W_k; ours
    feeds h_{t-1} through weight_hh and c through the diagonal peepholes, so the D.4 values are
    applied to weight_hh. D.4's values for the unrolled CIFAR-10 LSTM were found with
    hard-sigmoid gates (their section 5.3); ours are logistic.
    """

    gates = ("i", "f", "g", "o")
    second_state = "c"
    sigmoid_gates = ("i", "f", "o")          # g is the candidate, tanh
    forget_gate = "f"
    init_schemes = ("paper", "critical")
    # Appendix D.4, per gate (i, f, g, o): input variance nu^2, recurrent variance sigma^2, bias mu
    CRITICAL = {
        # "LSTM (Unrolled CIFAR-10 task)": nu_i^2 = nu_r^2 = sigma_o^2 = mu_f = 1,
        # sigma_i^2 = sigma_f^2 = sigma_r^2 = 1e-5, everything else 0
        False: dict(nu2=(1.0, 0.0, 1.0, 0.0), sigma2=(1e-5, 1e-5, 1e-5, 1.0),
                    mu=(0.0, 1.0, 0.0, 0.0)),
        # "Peephole LSTM": mu_f = 5, all sigma^2 = 1e-5, everything else 0
        True: dict(nu2=(0.0, 0.0, 0.0, 0.0), sigma2=(1e-5, 1e-5, 1e-5, 1e-5),
                   mu=(0.0, 5.0, 0.0, 0.0)),
    }

    def __init__(self, name, summary, peephole, reference):
        super().__init__(name, summary, K_lstm, reference)
        self.peephole = peephole
        self.torch_module = None if peephole else "LSTM"
        self.forward_kernels = K_lstm.peephole_lstm_forward if peephole else K_lstm.lstm_forward
        self.backward_kernels = (K_lstm.peephole_lstm_backward if peephole
                                 else K_lstm.lstm_backward)

    def shapes(self, m, n):
        s = super().shapes(m, n)
        if self.peephole:
            s.update(w_ci=(n,), w_cf=(n,), w_co=(n,))
        return s

    def count(self, m, n):
        return super().count(m, n) + (3 * n if self.peephole else 0)  # w_ci, w_cf, w_co

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        p = super().init(rng, m, n, dtype, sigma_w=sigma_w, scheme=scheme)
        if self.peephole:
            p.update(w_ci=np.zeros(n, dtype), w_cf=np.zeros(n, dtype), w_co=np.zeros(n, dtype))
        return p

    def critical_init(self, rng, m, n, dtype):
        c = self.CRITICAL[self.peephole]
        return _stacked(rng, m, n, dtype, [v / m for v in c["nu2"]],
                        [v / n for v in c["sigma2"]], c["mu"])

    def forward(self, p, x, h0=None, ws=None, backend=CPU, lengths=None, c0=None):
        """As Cell.forward; c0 (B, n) is c_0 (None: 0, as in the models)."""
        T, B, _ = x.shape
        n = p["weight_hh"].shape[1]
        hs = backend.states(ws, "hs", x, n, h0)
        cs = backend.states(ws, "cs", x, n, c0, label="c0")
        gates = backend.buffer(ws, "gates", (T, B, 4 * n), x.dtype)
        peepholes = (p["w_ci"], p["w_cf"], p["w_co"]) if self.peephole else ()
        backend.run_pass(self.forward_kernels, False, hs, cs, gates, x, p["weight_ih"],
                         p["weight_hh"], p["bias_ih"], p["bias_hh"], *peepholes,
                         sequence=backend.sequence(ws, x, n, lengths))
        return hs[T], dict(x=x, hs=hs, cs=cs, gates=gates, lengths=lengths)

    def backward(self, p, cache, dh_T, ws=None, out=None, backend=CPU, dhs=None, dc_T=None):
        """As Cell.backward; dc_T (B, n) is dL/dc_T (None: 0, c_T reaching the loss only
        through h_T, as in the models). dL/dc_0 is left in cache["dc0"]."""
        x, hs, cs, gates = cache["x"], cache["hs"], cache["cs"], cache["gates"]
        T, B, _ = x.shape
        n = p["weight_hh"].shape[1]
        g, dh0 = gradients(backend, out, p, B, n, x.dtype)
        da = backend.buffer(ws, "da", (T, B, 4 * n), x.dtype)
        dh_T = backend.upstream(dh_T, hs)
        dc = backend.carried(ws, "dc", dc_T, cs, "dc_T")    # dL/dc_T in, dL/dc_0 out
        dW = (g["weight_ih"], g["weight_hh"], g["bias_ih"], g["bias_hh"])
        state = (hs, cs, gates, x, p["weight_hh"])
        sequence = backend.sequence(ws, x, n, cache["lengths"], dhs, True)
        if self.peephole:
            backend.run_pass(self.backward_kernels, True, *dW, g["w_ci"], g["w_cf"], g["w_co"],
                             dh0, dc, da, dh_T, *state, p["w_ci"], p["w_cf"], p["w_co"],
                             sequence=sequence)
        else:
            backend.run_pass(self.backward_kernels, True, *dW, dh0, dc, da, dh_T, *state,
                             sequence=sequence)
        cache["da"], cache["dc0"] = da, dc
        return g, dh0


class GRUCell(StackedGateCell):
    """PyTorch's GRU, gates r, z, n (kernels/gru.py). The paper scheme sets all biases to 0
    (Appendix C's forget-gate bias is the LSTM's)."""

    gates = ("r", "z", "n")
    sigmoid_gates = ("r", "z")               # n is the candidate, tanh
    forward_kernels, backward_kernels = K_gru.gru_forward, K_gru.gru_backward
    torch_module = "GRU"
    input_weights = (("dgi", "weight_ih"),)

    def ignores_h0(self, p):
        return False                         # h_t = (1 - z) n + z h_{t-1}: h_{t-1} passes z

    def split_lanes(self, n, dtype):
        return K_gru.gru_split_lanes(n, dtype)   # W_hh in registers and shared memory

    def forward(self, p, x, h0=None, ws=None, backend=CPU, lengths=None):
        T, B, _ = x.shape
        n = p["weight_hh"].shape[1]
        hs = backend.states(ws, "hs", x, n, h0)
        gates = backend.buffer(ws, "gates", (T, B, 3 * n), x.dtype)
        hn = backend.buffer(ws, "hn", (T, B, n), x.dtype)
        backend.run_pass(self.forward_kernels, False, hs, gates, hn, x, p["weight_ih"],
                         p["weight_hh"], p["bias_ih"], p["bias_hh"],
                         sequence=backend.sequence(ws, x, n, lengths))
        return hs[T], dict(x=x, hs=hs, gates=gates, hn=hn, lengths=lengths)

    def backward(self, p, cache, dh_T, ws=None, out=None, backend=CPU, dhs=None):
        x, hs, gates, hn = cache["x"], cache["hs"], cache["gates"], cache["hn"]
        T, B, _ = x.shape
        n = p["weight_hh"].shape[1]
        g, dh0 = gradients(backend, out, p, B, n, x.dtype)
        dh_T = backend.upstream(dh_T, hs)
        dgi = backend.buffer(ws, "dgi", gates.shape, x.dtype)
        backend.run_pass(self.backward_kernels, True, g["weight_ih"], g["weight_hh"], g["bias_ih"],
                         g["bias_hh"], dh0, dgi, backend.buffer(ws, "dgh", gates.shape, x.dtype),
                         dh_T, hs, gates, hn, x, p["weight_hh"],
                         sequence=backend.sequence(ws, x, n, cache["lengths"], dhs, True))
        cache["dgi"] = dgi
        return g, dh0


register(RNNCell("rnn", "vanilla RNN, tanh(W_ih x + W_hh h + b) (PyTorch nn.RNN)", K_rnn,
                 reference=(reference.rnn_forward, reference.rnn_backward)))
register(LSTMCell("lstm", "LSTM, gates i f g o (PyTorch nn.LSTM)", peephole=False,
                  reference=(reference.lstm_forward, reference.lstm_backward)))
register(LSTMCell("peephole-lstm", "LSTM with peepholes on c (Gers et al. 2002)", peephole=True,
                  reference=(reference.peephole_lstm_forward,
                             reference.peephole_lstm_backward)))
register(GRUCell("gru", "GRU, gates r z n (PyTorch nn.GRU)", K_gru,
                 reference=(reference.gru_forward, reference.gru_backward)))
