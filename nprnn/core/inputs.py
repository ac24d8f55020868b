"""What a model takes, checked once before any kernel runs: a batch x (B, T, m) of floats and its
labels y (B,), or for a model with loss "mse" its targets y (B, K). The kernels have no bounds
checks, so what reaches them must fit; each refusal names the bad value and what is allowed.
"""
import numpy as np

from ..kernels import layout as K_layout


def check_batch(x, m):
    """x (B, T, m) of floats with B, T >= 1, on either device."""
    shape = tuple(x.shape)
    if len(shape) != 3 or shape[2] != m or shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"x must have shape (B, T, m) with B, T >= 1 and m = input_size = {m}; "
                         f"got shape {shape}")
    if not np.issubdtype(x.dtype, np.floating):
        if np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_:
            hint = "scale integer pixels first, e.g. x.astype('float32') / 255"
        elif np.issubdtype(x.dtype, np.complexfloating):
            hint = "the cells take real inputs: pass x.real, or np.abs(x), as your data means"
        else:
            hint = "convert it first, e.g. x.astype('float32')"
        raise TypeError(f"x must hold floating-point values (float32 or float64), got dtype "
                        f"{x.dtype}; {hint}")


def time_major_host(x, m, dtype, workspace):
    """A host batch x (B, T, m) as the kernels read it: time-major (T, B, m), contiguous, in
    `dtype`, in the workspace's buffer "x"; ValueError where x holds NaN, Inf or values beyond
    `dtype` (found as the copy is made)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy array of shape (B, T, {m}), got {type(x).__name__}")
    check_batch(x, m)
    given = x
    if x.dtype not in (np.float32, np.float64):            # float16, longdouble
        with np.errstate(over="ignore"):                   # said below, with the value
            x = x.astype(dtype)
    B, T, _ = x.shape
    xt = workspace.get("x", (T, B, m), dtype)
    if K_layout.time_major_cpu(xt, x):                     # True: a value is not finite
        raise _not_finite(given, xt, dtype)
    return xt


def _not_finite(given, xt, dtype):
    """The error for a batch with a value that is not finite as given, or not in `dtype`."""
    if not np.isfinite(given).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(given))[0])
        return ValueError(f"x contains NaN or Inf, first at index (b, t, j) = {bad}")
    t, b, j = (int(i) for i in np.argwhere(~np.isfinite(xt))[0])
    v = given[b, t, j]          # shown as a float, unless even float64 cannot hold it (a
    with np.errstate(over="ignore"):                                   # longdouble 1e400)
        shown = f"{float(v)}" if np.isfinite(float(v)) else str(v)
    return ValueError(f"x holds values beyond the range of the model's {np.dtype(dtype)}, "
                      f"first x[{b}, {t}, {j}] = {shown}")


def labels(y, B, K):
    """Integer labels y (B,) in [0, K) as a contiguous int64 array."""
    y = np.asarray(y)
    if y.shape != (B,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y must be integer labels of shape ({B},), got dtype {y.dtype} and "
                         f"shape {y.shape}")
    if y.min() < 0 or y.max() >= K:
        bad = int(y[(y < 0) | (y >= K)][0])
        raise ValueError(f"label {bad} out of range: labels must be in [0, {K - 1}] "
                         f"(num_classes = {K})")
    return np.ascontiguousarray(y, dtype=np.int64)


def targets(y, B, K, dtype):
    """Regression targets y (B, K) of floats, finite in `dtype`, as a contiguous `dtype` array."""
    y = np.asarray(y)
    if y.shape != (B, K) or not np.issubdtype(y.dtype, np.floating):
        raise ValueError(f"y must be float targets of shape ({B}, {K}) (B, K = output size) for "
                         f"loss 'mse', got dtype {y.dtype} and shape {y.shape}")
    with np.errstate(over="ignore"):                       # said below, with the value
        cast = np.ascontiguousarray(y, dtype=dtype)
    if not np.isfinite(cast).all():
        b, k = (int(i) for i in np.argwhere(~np.isfinite(cast))[0])
        how = "NaN or Inf" if not np.isfinite(y[b, k]) else f"beyond {np.dtype(dtype)}'s range"
        raise ValueError(f"y holds a value that is {how}, first y[{b}, {k}] = {y[b, k]}")
    return cast


def lengths(lengths, B, T):
    """Each row's length as the kernels take it: None where `lengths` is None or every row is T
    steps long, else a contiguous int64 (B,) array of integers in [1, T]."""
    if lengths is None:
        return None
    a = np.asarray(lengths)
    if a.shape != (B,) or not (np.issubdtype(a.dtype, np.integer) and a.dtype != np.bool_):
        raise ValueError(f"lengths must be integers of shape (B,) = ({B},), got dtype {a.dtype} "
                         f"and shape {a.shape}")
    bad = (a < 1) | (a > T)
    if bad.any():
        b = int(np.argmax(bad))
        raise ValueError(f"lengths[{b}] = {int(a[b])} is out of range: each row's length must "
                         f"be in [1, T] = [1, {T}]")
    return None if (a == T).all() else np.ascontiguousarray(a, dtype=np.int64)


def step_targets(y, B, T, K, dtype=None):
    """y of a readout at every step: labels (B, T) of ints in [-1, K) (-1: no loss at that step),
    or with `dtype` (loss "mse") targets (B, T, K) of floats, finite in `dtype`."""
    y = np.asarray(y)
    if dtype is not None:
        if y.shape != (B, T, K) or not np.issubdtype(y.dtype, np.floating):
            raise ValueError(f"y must be float targets of shape (B, T, K) = ({B}, {T}, {K}) for "
                             f"loss 'mse' at every step, got dtype {y.dtype} and shape {y.shape}")
        return targets(y.reshape(B * T, K), B * T, K, dtype).reshape(B, T, K)
    if y.shape != (B, T) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y must be integer labels of shape (B, T) = ({B}, {T}) for a readout "
                         f"at every step (-1: no loss there), got dtype {y.dtype} and shape "
                         f"{y.shape}")
    bad = (y < -1) | (y >= K)
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"label y[{b}, {t}] = {int(y[b, t])} out of range: labels must be in "
                         f"[0, {K - 1}] (num_classes = {K}), or -1 for no loss at that step")
    return np.ascontiguousarray(y, dtype=np.int64)
