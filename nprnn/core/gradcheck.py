"""Central finite differences: the first witness in the chain FD -> reference -> CPU -> GPU.

    dL/dp_i ~ (L(p + h e_i) - L(p - h e_i)) / (2 h)        error O(h^2), in float64

`relative_error` compares a whole gradient tensor at once, as the largest entrywise difference
over the largest entry:

    max_i |a_i - n_i| / max(max_i |a_i|, max_i |n_i|, 1e-12)

Entrywise ratios |a_i - n_i| / max(|a_i|, |n_i|) would blow up on entries that are almost zero
(where the finite difference is all rounding noise) and say nothing about the tensor; scaling by
the tensor's largest entry keeps the check strict (1e-6 of the largest gradient) and stable.
"""
import numpy as np

from .memory import is_device_array


def numerical_gradient(f, p, h=1e-5, mask=None):
    """dF/dp by central differences, perturbing p in place (and restoring it).

    f: () -> float, reads p. mask: optional 0/1 array; entries where mask == 0 are skipped and
    their gradient reported as 0 (e.g. the lower triangle of an antisymmetric W).
    p must be a writable, C-contiguous float64 array, so that each perturbation reaches it in
    full: a copy (reshaping a strided view makes one) would leave f's input unchanged, and a
    float32 or integer p would round p +- h."""
    if is_device_array(p):          # a cuda model's parameter: perturbed in place on the GPU
        ok = p.dtype == np.float64 and p.is_c_contiguous()
    else:
        ok = (isinstance(p, np.ndarray) and p.dtype == np.float64 and p.flags.c_contiguous
              and p.flags.writeable)
    if not ok:
        raise ValueError(f"p must be a writable, C-contiguous float64 array, got "
                         f"{_describe(p)}")
    if mask is not None and np.shape(mask) != p.shape:
        raise ValueError(f"mask has shape {np.shape(mask)}, p has shape {p.shape}")
    grad = np.zeros(p.shape, dtype=np.float64)
    flat, gflat = p.reshape(-1), grad.reshape(-1)
    mflat = None if mask is None else np.asarray(mask).reshape(-1)
    for i in range(flat.size):
        if mflat is not None and mflat[i] == 0:
            continue
        old = flat[i]
        flat[i] = old + h
        f_plus = f()
        flat[i] = old - h
        f_minus = f()
        flat[i] = old
        gflat[i] = (f_plus - f_minus) / (2 * h)
    return grad


def _describe(a):
    if is_device_array(a):
        return f"{'' if a.is_c_contiguous() else 'strided '}{a.dtype} device array"
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    flags = [f for f, bad in (("strided", not a.flags.c_contiguous),
                              ("read-only", not a.flags.writeable)) if bad]
    return " ".join([*flags, str(a.dtype), "array"])


def relative_error(analytic, numeric):
    """max |a - n| / max(max |a|, max |n|, 1e-12) over the whole tensor."""
    a = np.asarray(analytic, dtype=np.float64)
    n = np.asarray(numeric, dtype=np.float64)
    if a.shape != n.shape:
        raise ValueError(f"analytic has shape {a.shape}, numeric has shape {n.shape}: "
                         f"compare gradients of the same tensor")
    scale = max(np.abs(a).max(initial=0.0), np.abs(n).max(initial=0.0), 1e-12)
    return float(np.abs(a - n).max(initial=0.0) / scale)


def check_model_gradients(model, x, y, h=1e-5):
    """Finite-difference check of `model.loss_and_grad` for every parameter tensor.

    The model must be float64. Returns {name: relative error}."""
    if model.dtype != np.float64:
        raise ValueError(f"finite differences need a float64 model, got {model.dtype}")
    _, grads = model.loss_and_grad(x, y)
    errors = {}
    for name, p in model.params.items():
        mask = model.cell.grad_mask(name, model.hidden_size)
        numeric = numerical_gradient(lambda: model.loss_and_grad(x, y)[0], p, h=h, mask=mask)
        errors[name] = relative_error(grads[name], numeric)
    return errors
