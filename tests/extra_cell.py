"""A cell that nprnn does not register, declared from one spec: the gated feedback RNN

    z_t = sigma(W h_{t-1} + V_z x_t + b_z)
    h_t = h_{t-1} + eps z_t o tanh(W h_{t-1} + V_h x_t + b_h)

(eq. 13 with neither W - W^T nor the diffusion gamma I: an `EulerCell` on the kernels of
kernels/antisym.py, with its own float64 reference below). Registering it is all that it takes
for the registry-driven checks to cover it: tests/test_extra_cell.py runs the CPU ones (finite
differences, the reference, float32, workspaces, PTX, bench), tests/gpu/test_gpu_extra_cell.py
the GPU twins. A cell of a new family would add its kernels and its spec class the same way.
"""
import itertools

import numpy as np

import nprnn
from nprnn.core import reference
from nprnn.core.cells import EulerCell

NAME = "feedback-gated"


def reference_forward(p, x, eps, h0=None):
    p = {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}
    return reference.euler_forward(np.asarray(x, dtype=np.float64), p["W"], p["V_h"], p["b_h"],
                                   eps, V_z=p["V_z"], b_z=p["b_z"], h0=h0)


def reference_backward(p, cache, dh_T, eps):
    dA, dV_h, db_h, dV_z, db_z, dh0 = reference.euler_backward(cache, dh_T)
    return dict(W=dA, V_h=dV_h, b_h=db_h, V_z=dV_z, b_z=db_z), dh0


SPEC = EulerCell(NAME, "gated feedback RNN (a test's cell)", antisymmetric=False, gated=True,
                 uses_gamma=False, reference=(reference_forward, reference_backward))


def register(monkeypatch):
    """The spec in nprnn.CELLS for one test (monkeypatch takes it out again)."""
    monkeypatch.setitem(nprnn.CELLS, NAME, SPEC)


def run_check(check, name, argname="name"):
    """Call a registry check for the cell `name` with every value of its other parametrizations
    (the loss, ...), as pytest would, so that a check parametrized further still runs whole."""
    others = [m for m in getattr(check, "pytestmark", [])
              if m.name == "parametrize" and m.args[0] != argname]
    for values in itertools.product(*(m.args[1] for m in others)):
        check(**{argname: name}, **{m.args[0]: v for m, v in zip(others, values)})


def registry_checks(module, argnames, values):
    """The test functions of `module` parametrized over the registry: argnames as given, with
    argument values `values` (the registry's names, or (name, version) pairs)."""
    found = []
    for attr, fn in vars(module).items():
        marks = getattr(fn, "pytestmark", [])
        if attr.startswith("test_") and any(m.name == "parametrize" and m.args[0] == argnames
                                            and list(m.args[1]) == list(values) for m in marks):
            found.append(fn)
    return found
