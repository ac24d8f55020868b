"""The cell registry: parameter names and shapes, initialisation, parameter counting, and how each
cell's kernels are called.

A cell is a recurrence h_t = f(h_{t-1}, x_t) over a whole sequence. Each entry of `CELLS` knows:

    shapes(m, n)            parameter name -> shape (the exact names of the README's table)
    num_params(m, n)        trainable scalars (W of the antisymmetric models counts n(n-1)/2)
    init(rng, m, n, ...)    parameters at initialisation (Appendix C, or the critical one)
    forward(p, x, h0)       run the CPU kernels; x is time-major (T, B, m); -> (h_T, cache)
    backward(p, cache, dh_T) -> (grads, dh_0), grads with the same keys as p
    reference_forward/backward   the float64 oracle in `nprnn/reference.py`, same contract but
                            batch-major x (B, T, m)
    grad_mask(name)         None, or a 0/1 array that the gradient of `name` already respects
                            (the strict upper triangle of an antisymmetric W)

Tests iterate over `CELLS`, so a cell added here cannot arrive without its gradient checks.
"""
import numpy as np

from . import reference
from .kernels import antisym as K_euler

# Appendix C grid: eps in {0.01, 0.1, 1}, gamma in {0.001, 0.01, 0.1, 1}, sigma_w in
# {0, 1, 2, 4, 8, 16}. The defaults below are points of that grid.
DEFAULT_EPS = 0.01
DEFAULT_GAMMA = 0.01
INIT_SCHEMES = ("paper", "critical")


def gaussian(rng, shape, var, dtype):
    """N(0, var) entries; var = 0 gives zeros (sigma_w = 0 is on the paper's grid)."""
    if var == 0:
        return np.zeros(shape, dtype=dtype)
    return (rng.standard_normal(shape) * np.sqrt(var)).astype(dtype)


class Cell:
    """Base class: the defaults that most cells share. Subclasses set `name`, `summary`,
    `hyper` (which of eps, gamma the cell reads) and implement the abstract methods."""

    name = ""
    summary = ""
    hyper = ()
    init_schemes = ("paper",)

    def shapes(self, m, n):
        raise NotImplementedError

    def num_params(self, m, n):
        return int(sum(np.prod(s) for s in self.shapes(m, n).values()))

    def grad_mask(self, name, n):
        return None

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        raise NotImplementedError

    def forward(self, p, x, h0, **hyper):
        raise NotImplementedError

    def backward(self, p, cache, dh_T, **hyper):
        raise NotImplementedError

    def reference_forward(self, p, x, h0=None, **hyper):
        return getattr(reference, self.ref_name + "_forward")(p, x, h0=h0, **hyper)

    def reference_backward(self, p, cache, dh_T, **hyper):
        return getattr(reference, self.ref_name + "_backward")(p, cache, dh_T, **hyper)

    @property
    def ref_name(self):
        return self.name.replace("-", "_")


def _states(x, n, h0):
    """hs (T+1, B, n) with hs[0] = h_0 (zero unless given)."""
    T, B, _ = x.shape
    hs = np.empty((T + 1, B, n), dtype=x.dtype)
    hs[0] = 0.0 if h0 is None else h0
    return hs


class EulerCell(Cell):
    """antisym (12), antisym-gated (13), ablation (5.4) and feedback (section 4): one forward-Euler
    step h_t = h_{t-1} + eps [z_t o] tanh(A h_{t-1} + V_h x_t + b_h), differing only in how the
    recurrent matrix A is made from W and whether the input gate z_t exists."""

    hyper = ("eps", "gamma")

    def __init__(self, name, summary, antisymmetric, gated, uses_gamma=True):
        self.name, self.summary = name, summary
        self.antisymmetric, self.gated = antisymmetric, gated
        self.hyper = ("eps", "gamma") if uses_gamma else ("eps",)

    def shapes(self, m, n):
        s = dict(W=(n, n), V_h=(n, m), b_h=(n,))
        if self.gated:
            s.update(V_z=(n, m), b_z=(n,))
        return s

    def num_params(self, m, n):
        total = super().num_params(m, n)
        return total - n * (n + 1) // 2 if self.antisymmetric else total

    def grad_mask(self, name, n):
        if self.antisymmetric and name == "W":
            return np.triu(np.ones((n, n)), k=1)
        return None

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        # Appendix C: input-to-hidden N(0, 1/m), hidden-to-hidden N(0, sigma_w^2 / n), biases 0.
        p = dict(W=gaussian(rng, (n, n), sigma_w ** 2 / n, dtype),
                 V_h=gaussian(rng, (n, m), 1.0 / m, dtype),
                 b_h=np.zeros(n, dtype))
        if self.antisymmetric:
            p["W"] = np.triu(p["W"], k=1)
        if self.gated:
            p["V_z"] = gaussian(rng, (n, m), 1.0 / m, dtype)
            p["b_z"] = np.zeros(n, dtype)
        return p

    def matrix(self, W, gamma):
        """The recurrent matrix A that the kernels use."""
        if self.antisymmetric:
            A = np.empty_like(W)
            K_euler.antisym_matrix_cpu(A, W, gamma)
            return A
        if self.gated:                         # ablation: A = W - gamma I
            return W - gamma * np.eye(W.shape[0], dtype=W.dtype)
        return W                               # feedback: A = W

    def dW(self, dA):
        if self.antisymmetric:
            dW = np.empty_like(dA)
            K_euler.antisym_dW_cpu(dW, dA)
            return dW
        return dA

    def forward(self, p, x, h0=None, eps=DEFAULT_EPS, gamma=DEFAULT_GAMMA):
        T, B, _ = x.shape
        n = p["b_h"].shape[0]
        A = self.matrix(p["W"], gamma)
        hs = _states(x, n, h0)
        th = np.empty((T, B, n), dtype=x.dtype)
        cache = dict(x=x, A=A, hs=hs, th=th)
        if self.gated:
            z = np.empty_like(th)
            K_euler.euler_gated_forward_cpu(hs, th, z, x, A, p["V_h"], p["b_h"],
                                            p["V_z"], p["b_z"], eps)
            cache["z"] = z
        else:
            K_euler.euler_forward_cpu(hs, th, x, A, p["V_h"], p["b_h"], eps)
        return hs[T], cache

    def backward(self, p, cache, dh_T, eps=DEFAULT_EPS, gamma=DEFAULT_GAMMA):
        x, A, hs, th = cache["x"], cache["A"], cache["hs"], cache["th"]
        g = {k: np.empty_like(v) for k, v in p.items()}
        dA = np.empty_like(A)
        dh0 = np.empty_like(hs[0])
        da = np.empty_like(th)
        if self.gated:
            K_euler.euler_gated_backward_cpu(dA, g["V_h"], g["b_h"], g["V_z"], g["b_z"], dh0,
                                             da, np.empty_like(th), np.empty_like(th),
                                             dh_T, hs, th, cache["z"], x, A, eps)
        else:
            K_euler.euler_backward_cpu(dA, g["V_h"], g["b_h"], dh0, da, dh_T, hs, th, x, A, eps)
        g["W"] = self.dW(dA)
        return g, dh0


CELLS = {}


def register(cell):
    CELLS[cell.name] = cell
    return cell


register(EulerCell("antisym", "AntisymmetricRNN, eq. (12)", antisymmetric=True, gated=False))
register(EulerCell("antisym-gated", "AntisymmetricRNN with gating, eq. (13)",
                   antisymmetric=True, gated=True))
register(EulerCell("ablation", "eq. (13) with an unstructured W (section 5.4)",
                   antisymmetric=False, gated=True))
register(EulerCell("feedback", "RNN with feedback, h + eps tanh(W h + V x + b) (section 4)",
                   antisymmetric=False, gated=False, uses_gamma=False))
