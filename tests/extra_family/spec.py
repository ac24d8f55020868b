"""The leaky tanh cell's spec: how nprnn/core/cells.py declares a family, here for a family
whose kernels (kernels.py) and reference (reference.py) sit beside it, outside nprnn.

    y_t = tanh(W h_{t-1} + V_h x_t + b_h),   h_t = (1 - alpha) h_{t-1} + alpha y_t

The leak alpha is fixed (ALPHA), not a hyperparameter: the model takes neither eps nor gamma.
Registering SPEC into nprnn.CELLS (`register`) is all it takes for the registry-driven checks to
cover it: tests/test_extra_family.py and tests/gpu/test_gpu_extra_family.py.
"""
import numpy as np

from extra_family import kernels as K
from extra_family import reference
from nprnn.core.backends import CPU
from nprnn.core.cells import CELLS, Cell, gaussian, gradients

NAME = "leaky"
ALPHA = 0.5


class LeakyCell(Cell):
    """The leaky tanh cell, GPU version 1 only (one launch per step)."""

    forward_kernels, backward_kernels = K.leaky_forward, K.leaky_backward
    input_weights = (("da", "V_h"),)          # x_t enters through V_h x_t alone

    def __init__(self, name, summary, alpha):
        self.name, self.summary, self.alpha = name, summary, alpha
        self.reference = (reference.leaky_forward, reference.leaky_backward)

    def shapes(self, m, n):
        return dict(W=(n, n), V_h=(n, m), b_h=(n,))

    def count(self, m, n):
        return n * n + n * m + n                           # W, V_h, b_h

    def init(self, rng, m, n, dtype, sigma_w=1.0, scheme="paper"):
        self.check_init(scheme)
        return dict(W=gaussian(rng, (n, n), sigma_w ** 2 / n, dtype),
                    V_h=gaussian(rng, (n, m), 1.0 / m, dtype), b_h=np.zeros(n, dtype))

    def persistent_layouts(self, n, dtype, backward, rows=1):
        return []                                          # no persistent kernels

    def reference_forward(self, p, x, h0=None):
        return self.reference[0](p, x, self.alpha, h0=h0)

    def reference_backward(self, p, cache, dh_T):
        return self.reference[1](p, cache, dh_T, self.alpha)

    def forward(self, p, x, h0=None, ws=None, backend=CPU, lengths=None):
        T, B, _ = x.shape
        n = p["W"].shape[0]
        hs = backend.states(ws, "hs", x, n, h0)
        th = backend.buffer(ws, "th", (T, B, n), x.dtype)
        backend.run_pass(self.forward_kernels, False, hs, th, x, p["W"], p["V_h"], p["b_h"],
                         backend.scalar(self.alpha, x.dtype),
                         sequence=backend.sequence(ws, x, n, lengths))
        return hs[T], dict(x=x, hs=hs, th=th, lengths=lengths)

    def backward(self, p, cache, dh_T, ws=None, out=None, backend=CPU, dhs=None):
        x, hs, th = cache["x"], cache["hs"], cache["th"]
        T, B, _ = x.shape
        n = p["W"].shape[0]
        g, dh0 = gradients(backend, out, p, B, n, x.dtype)
        da = backend.buffer(ws, "da", (T, B, n), x.dtype)
        backend.run_pass(self.backward_kernels, True, g["W"], g["V_h"], g["b_h"], dh0, da,
                         backend.upstream(dh_T, hs), hs, th, x, p["W"],
                         backend.scalar(self.alpha, x.dtype),
                         sequence=backend.sequence(ws, x, n, cache["lengths"], dhs, True))
        cache["da"] = da                    # dL/du_t of u_t = V_h x_t: input_grads reads it
        return g, dh0


SPEC = LeakyCell(NAME, f"leaky tanh RNN, alpha = {ALPHA} (a test's family)", ALPHA)


def register(monkeypatch):
    """The spec in the registry (nprnn.CELLS) for one test (monkeypatch takes it out again)."""
    monkeypatch.setitem(CELLS, NAME, SPEC)
