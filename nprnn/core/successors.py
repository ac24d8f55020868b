"""The successors of AntisymmetricRNN in the registry (cells.py): coRNN (Rusch & Mishra, ICLR
2021), in the official code's step and the paper's IMEX step, and LEM (Rusch, Mishra, Erichson &
Mahoney, ICLR 2022). Their specs register themselves when this module is imported, which
nprnn/core/__init__.py does, so that `CELLS` holds them wherever it is read.
"""
import numpy as np

from . import reference
from .backends import CPU
from .cells import Cell, Hyper, gradients, register
from ..kernels import cornn as K_cornn
from ..kernels import lem as K_lem


# ----------------------------------------------------------------------------------------------
# The successors of AntisymmetricRNN: coRNN (Rusch & Mishra, ICLR 2021) and LEM (Rusch, Mishra,
# Erichson & Mahoney, ICLR 2022), as their official code computes them. Both have two states:
# y, which the readout reads (hs), and z, internal as an LSTM's c is (z_0 = 0; `h0` sets y_0
# only, and backward's dh_0 is dL/dy_0). Their parameters start as the official code starts
# them, U(-1/sqrt(fan_in), 1/sqrt(fan_in)); sigma_w scales the bound of the recurrent matrices
# (those acting on y and z), so that sigma_w = 1, the default, is the official initialisation.
# from_official / to_official exchange the weights with the official code's state_dict.
# ----------------------------------------------------------------------------------------------

# the defaults: the official sMNIST settings (coRNN's sMNIST/sMNIST_task.py, LEM's
# src/sMNIST/sMNIST_task.py)
CORNN_DT, CORNN_GAMMA, CORNN_EPSILON = 0.042, 2.7, 4.7
LEM_DT = 0.21


def uniform(rng, shape, bound, dtype):
    """U(-bound, bound) entries, as PyTorch's nn.Linear starts its weights and biases."""
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def official_cell_state(state):
    """The official cell's state_dict as NumPy arrays, with a model's "cell." prefix dropped
    (model.state_dict() and model.cell.state_dict() both load)."""
    return {k[len("cell."):] if k.startswith("cell.") else k: np.asarray(v)
            for k, v in state.items()}


class CoRNNCell(Cell):
    """coRNN (kernels/cornn.py): s_t = tanh(W y_{t-1} + W_z z_{t-1} + V u_t + b),
    z_t = z_{t-1} + dt (s_t - gamma y_{t-1} - epsilon z_{t-1}), y_t = y_{t-1} + dt z_t, as the
    official code steps it; with `imex`, the paper's eq. (3), damping the new z:
    z_t = (z_{t-1} + dt (s_t - gamma y_{t-1})) / (1 + dt epsilon). The two forms are two
    registered cells ("cornn", "cornn-imex"): different maps, each checked by every registry test,
    and a run's config names the one it trained."""

    hyper = {"dt": Hyper(CORNN_DT, above=True, help="Time step dt of coRNN"),
             "gamma": Hyper(CORNN_GAMMA, help="Restoring force gamma of coRNN"),
             "epsilon": Hyper(CORNN_EPSILON, help="Damping epsilon of coRNN")}
    input_weights = (("da", "V"),)           # u_t enters through V u_t alone
    second_state = "z"                       # the velocity z beside the position y (= h)
    product_blocks = (2, 1)                  # W y_{t-1} and W_z z_{t-1}; V u_t
    forward_kernels, backward_kernels = K_cornn.cornn_forward, K_cornn.cornn_backward

    def __init__(self, name, summary, imex, reference):
        self.name, self.summary, self.imex, self.reference = name, summary, imex, reference

    def shapes(self, m, n):
        return dict(W=(n, n), W_z=(n, n), V=(n, m), b=(n,))

    def count(self, m, n):
        return 2 * n * n + n * m + n                       # W, W_z, V, b

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        self.check_init(scheme)
        # the official i2h = nn.Linear(m + 2n, n): weight then bias, U(-1/sqrt(m + 2n), ...)
        bound = 1.0 / np.sqrt(m + 2 * n)
        p = self.from_official({"i2h.weight": uniform(rng, (n, m + 2 * n), bound, np.float64),
                                "i2h.bias": uniform(rng, (n,), bound, np.float64)})
        p["W"] *= sigma_w
        p["W_z"] *= sigma_w
        return {k: v.astype(dtype) for k, v in p.items()}

    def from_official(self, state):
        """The parameters from the official cell's state_dict: `i2h.weight` (n, m + 2n), whose
        columns act on (u, z, y) in that order, and `i2h.bias` (n,) (a model's "cell." prefix
        dropped; its `readout.weight` and `readout.bias` are our W_out and b_out)."""
        state = official_cell_state(state)
        weight, bias = state["i2h.weight"], state["i2h.bias"]
        n = weight.shape[0]
        m = weight.shape[1] - 2 * n
        return dict(W=weight[:, m + n:].copy(), W_z=weight[:, m:m + n].copy(),
                    V=weight[:, :m].copy(), b=bias.copy())

    def to_official(self, p):
        """The official cell's state_dict (NumPy arrays) from the parameters p."""
        return {"i2h.weight": np.concatenate([p["V"], p["W_z"], p["W"]], axis=1),
                "i2h.bias": np.array(p["b"])}

    def persistent_layouts(self, n, dtype, backward, rows=1):
        return []                                          # GPU version 1 alone

    def scalars(self, backend, dtype, dt, gamma, epsilon):
        """(dt, dt_z, gamma, epsilon) as the kernels take them: z's step dt_z is dt in the
        code's form, dt / (1 + dt epsilon) in the IMEX form (kernels/cornn.py), made in float64
        and rounded once."""
        dt_z = dt / (1.0 + dt * epsilon) if self.imex else dt
        return tuple(backend.scalar(v, dtype) for v in (dt, dt_z, gamma, epsilon))

    def forward(self, p, x, h0=None, ws=None, backend=CPU, lengths=None, dt=CORNN_DT,
                gamma=CORNN_GAMMA, epsilon=CORNN_EPSILON, z0=None):
        """As Cell.forward; z0 (B, n) is z_0 (None: 0, as in the models)."""
        T, B, _ = x.shape
        n = p["b"].shape[0]
        hs = backend.states(ws, "hs", x, n, h0)            # y_0 .. y_T
        zs = backend.states(ws, "zs", x, n, z0, label="z0")   # z_0 (0 unless given)
        th = backend.buffer(ws, "th", (T, B, n), x.dtype)
        backend.run_pass(self.forward_kernels, False, hs, zs, th, x, p["W"], p["W_z"], p["V"],
                         p["b"], *self.scalars(backend, x.dtype, dt, gamma, epsilon),
                         sequence=backend.sequence(ws, x, n, lengths))
        return hs[T], dict(x=x, hs=hs, zs=zs, th=th, lengths=lengths)

    def backward(self, p, cache, dh_T, ws=None, out=None, backend=CPU, dhs=None, dt=CORNN_DT,
                 gamma=CORNN_GAMMA, epsilon=CORNN_EPSILON, dz_T=None):
        """As Cell.backward; dz_T (B, n) is dL/dz_T (None: 0, z_T reaching the loss only
        through y, as in the models). dL/dz_0 is left in cache["dz0"]."""
        x, hs, zs, th = cache["x"], cache["hs"], cache["zs"], cache["th"]
        T, B, _ = x.shape
        n = p["b"].shape[0]
        g, dh0 = gradients(backend, out, p, B, n, x.dtype)
        dz = backend.carried(ws, "dz", dz_T, zs, "dz_T")    # dL/dz_T in, dL/dz_0 out
        da = backend.buffer(ws, "da", (T, B, n), x.dtype)
        backend.run_pass(self.backward_kernels, True, g["W"], g["W_z"], g["V"], g["b"], dh0, dz,
                         da, backend.upstream(dh_T, hs), hs, zs, th, x, p["W"], p["W_z"],
                         *self.scalars(backend, x.dtype, dt, gamma, epsilon),
                         sequence=backend.sequence(ws, x, n, cache["lengths"], dhs, True))
        cache["da"], cache["dz0"] = da, dz  # da: dL/du_t of u_t = V x_t, which input_grads reads
        return g, dh0


register(CoRNNCell("cornn", "coRNN, the official code's step (Rusch & Mishra 2021)", imex=False,
                   reference=(reference.cornn_forward, reference.cornn_backward)))
register(CoRNNCell("cornn-imex", "coRNN, the paper's IMEX step, eq. (3)", imex=True,
                   reference=(reference.cornn_imex_forward, reference.cornn_backward)))


class LEMCell(Cell):
    """LEM (kernels/lem.py), in the official layout and chunk order:
    gbar_t = dt sigmoid(A1 + H1), g_t = dt sigmoid(A2 + H2) from [A1|A2|A3|A4] = weight_ih u_t +
    bias_ih and [H1|H2|H3] = weight_hh y_{t-1} + bias_hh; z_t = (1 - g_t) z_{t-1} +
    g_t tanh(A4 + H3); y_t = (1 - gbar_t) y_{t-1} + gbar_t tanh(weight_z z_t + bias_z + A3)."""

    hyper = {"dt": Hyper(LEM_DT, above=True, help="Time step dt of LEM")}
    sigmoid_gates = ("y_gate", "z_gate")     # sigmoid(A1 + H1) = gbar_t / dt, sigmoid(A2 + H2)
    input_weights = (("da", "weight_ih"),)   # u_t enters through weight_ih u_t alone
    second_state = "z"                       # the slow state z beside y (= h)
    product_blocks = (4, 4)                  # weight_hh y_{t-1} (3n), weight_z z_t; weight_ih u_t
    forward_kernels, backward_kernels = K_lem.lem_forward, K_lem.lem_backward
    # the official module's parameters, in its order, and our names for them
    OFFICIAL = {"inp2hid.weight": "weight_ih", "inp2hid.bias": "bias_ih",
                "hid2hid.weight": "weight_hh", "hid2hid.bias": "bias_hh",
                "transform_z.weight": "weight_z", "transform_z.bias": "bias_z"}

    def __init__(self, name, summary, reference):
        self.name, self.summary, self.reference = name, summary, reference

    def shapes(self, m, n):
        return dict(weight_ih=(4 * n, m), bias_ih=(4 * n,), weight_hh=(3 * n, n),
                    bias_hh=(3 * n,), weight_z=(n, n), bias_z=(n,))

    def count(self, m, n):
        return 4 * n * m + 4 * n + 3 * n * n + 3 * n + n * n + n    # inp2hid, hid2hid, transform_z

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        self.check_init(scheme)
        # the official reset_parameters: every cell parameter U(-1/sqrt(n), 1/sqrt(n)), drawn in
        # the module's order; sigma_w scales the recurrent matrices' bound
        bound = 1.0 / np.sqrt(n)
        recurrent = {"weight_hh", "weight_z"}
        return {name: uniform(rng, shape, bound * (sigma_w if name in recurrent else 1.0), dtype)
                for name, shape in self.shapes(m, n).items()}

    def from_official(self, state):
        """The parameters from the official cell's state_dict (`inp2hid`, `hid2hid`,
        `transform_z`; a model's "cell." prefix dropped; its `classifier.weight` and
        `classifier.bias` are our W_out and b_out): a renaming, the layouts are the same."""
        state = official_cell_state(state)
        return {ours: state[theirs].copy() for theirs, ours in self.OFFICIAL.items()}

    def to_official(self, p):
        """The official cell's state_dict (NumPy arrays) from the parameters p."""
        return {theirs: np.array(p[ours]) for theirs, ours in self.OFFICIAL.items()}

    def persistent_layouts(self, n, dtype, backward, rows=1):
        return []                                          # GPU version 1 alone

    def gate_values(self, cache):
        # the forward kernels keep (y's gate, z's gate, y's candidate, z's candidate) per step
        n = cache["hs"].shape[2]
        return {"y_gate": cache["gates"][:, :, :n], "z_gate": cache["gates"][:, :, n:2 * n]}

    def forward(self, p, x, h0=None, ws=None, backend=CPU, lengths=None, dt=LEM_DT, z0=None):
        """As Cell.forward; z0 (B, n) is z_0 (None: 0, as in the models)."""
        T, B, _ = x.shape
        n = p["weight_z"].shape[0]
        hs = backend.states(ws, "hs", x, n, h0)            # y_0 .. y_T
        zs = backend.states(ws, "zs", x, n, z0, label="z0")   # z_0 (0 unless given)
        gates = backend.buffer(ws, "gates", (T, B, 4 * n), x.dtype)
        backend.run_pass(self.forward_kernels, False, hs, zs, gates, x, p["weight_ih"],
                         p["weight_hh"], p["weight_z"], p["bias_ih"], p["bias_hh"], p["bias_z"],
                         backend.scalar(dt, x.dtype), sequence=backend.sequence(ws, x, n, lengths))
        return hs[T], dict(x=x, hs=hs, zs=zs, gates=gates, lengths=lengths)

    def backward(self, p, cache, dh_T, ws=None, out=None, backend=CPU, dhs=None, dt=LEM_DT,
                 dz_T=None):
        """As Cell.backward; dz_T (B, n) is dL/dz_T (None: 0, as in the models). dL/dz_0 is
        left in cache["dz0"]."""
        x, hs, zs, gates = cache["x"], cache["hs"], cache["zs"], cache["gates"]
        T, B, _ = x.shape
        n = p["weight_z"].shape[0]
        g, dh0 = gradients(backend, out, p, B, n, x.dtype)
        dz = backend.carried(ws, "dz", dz_T, zs, "dz_T")    # dL/dz_T in, dL/dz_0 out
        da = backend.buffer(ws, "da", (T, B, 4 * n), x.dtype)
        backend.run_pass(self.backward_kernels, True, g["weight_ih"], g["weight_hh"],
                         g["weight_z"], g["bias_ih"], g["bias_hh"], g["bias_z"], dh0, dz, da,
                         backend.buffer(ws, "dgh", (T, B, 3 * n), x.dtype),
                         backend.buffer(ws, "dq", (T, B, n), x.dtype),
                         backend.upstream(dh_T, hs), hs, zs, gates, x, p["weight_hh"],
                         p["weight_z"], backend.scalar(dt, x.dtype),
                         sequence=backend.sequence(ws, x, n, cache["lengths"], dhs, True))
        cache["da"], cache["dz0"] = da, dz  # da: dL/du_t of u_t = weight_ih x_t (input_grads)
        return g, dh0


register(LEMCell("lem", "Long Expressive Memory (Rusch et al. 2022)",
                 reference=(reference.lem_forward, reference.lem_backward)))
