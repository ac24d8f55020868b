"""The oracle: every cell's forward pass and BPTT in plain float64 NumPy, obvious and slow.

Nothing here is optimised. Each function follows its equation line by line, loops over time in
Python and keeps every intermediate, so that a reader can check it against the paper by eye and the
kernels (`nprnn/kernels/`) can be checked against it by a test. The finite-difference tests check
*this* file; the kernel tests check the kernels against this file.

Conventions (as in the paper): B batch, T time, m input size, n hidden size, K classes.
Inputs are batch-major here, x: (B, T, m); h_0 = 0 unless `h0` is given.
Each `<cell>_forward(p, x, ...)` returns (h_T, cache); each `<cell>_backward(p, cache, dh_T, ...)`
returns (grads, dh_0), grads having the same keys as p.
"""
import numpy as np


def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _h0(x, n, h0):
    return np.zeros((x.shape[0], n)) if h0 is None else np.array(h0, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The Euler ("feedback") family: antisym (12), antisym-gated (13), ablation, feedback (section 4).
# All four are h_t = h_{t-1} + eps * [z_t o] tanh(A h_{t-1} + V_h x_t + b_h) with a different
# recurrent matrix A built from the parameter W; only the gated ones have z_t.
# ---------------------------------------------------------------------------------------------

def antisym_matrix(W, gamma):
    """A = W - W^T - gamma I: antisymmetric up to the diffusion term (eq. 12)."""
    return W - W.T - gamma * np.eye(W.shape[0])


def antisym_dW(dA):
    """A = W - W^T - gamma I  =>  dL/dW_ij = dA_ij - dA_ji, kept on the strict upper triangle."""
    return np.triu(dA - dA.T, k=1)


def euler_forward(x, A, V_h, b_h, eps, V_z=None, b_z=None, h0=None):
    """(12)/(13): h_t = h_{t-1} + eps * z_t * tanh(A h_{t-1} + V_h x_t + b_h),
    z_t = sigmoid(A h_{t-1} + V_z x_t + b_z) when gated, else z_t = 1."""
    B, T, m = x.shape
    n = A.shape[0]
    gated = V_z is not None
    h = _h0(x, n, h0)
    hs, ths, zs = [h], [], []
    for t in range(T):
        x_t = x[:, t, :]                              # (B, m)
        a = h @ A.T + x_t @ V_h.T + b_h               # (B, n)
        th = np.tanh(a)
        if gated:
            z = sigmoid(h @ A.T + x_t @ V_z.T + b_z)  # (B, n)
        else:
            z = np.ones_like(th)
        h = h + eps * z * th
        hs.append(h)
        ths.append(th)
        zs.append(z)
    return h, dict(x=x, A=A, hs=hs, ths=ths, zs=zs, gated=gated, eps=eps)


def euler_backward(cache, dh_T):
    """BPTT through euler_forward. Returns dA, dV_h, db_h, dV_z, db_z (None when ungated), dh_0."""
    x, A, hs, ths, zs, eps = (cache[k] for k in ("x", "A", "hs", "ths", "zs", "eps"))
    gated = cache["gated"]
    B, T, m = x.shape
    dA = np.zeros_like(A)
    dV_h = np.zeros((A.shape[0], m))
    db_h = np.zeros(A.shape[0])
    dV_z = np.zeros_like(dV_h)
    db_z = np.zeros_like(db_h)
    dh = np.array(dh_T, dtype=np.float64)
    for t in reversed(range(T)):
        x_t, h_prev, th, z = x[:, t, :], hs[t], ths[t], zs[t]
        # forward was: h = h_prev + eps * z * th
        dth = dh * eps * z
        # forward was: th = tanh(a),  a = A h_prev + V_h x_t + b_h
        da = dth * (1.0 - th ** 2)
        dh_prev = dh + da @ A
        dA += da.T @ h_prev
        dV_h += da.T @ x_t
        db_h += da.sum(axis=0)
        if gated:
            # forward was: z = sigmoid(zp),  zp = A h_prev + V_z x_t + b_z
            dzp = dh * eps * th * z * (1.0 - z)
            dh_prev += dzp @ A
            dA += dzp.T @ h_prev
            dV_z += dzp.T @ x_t
            db_z += dzp.sum(axis=0)
        dh = dh_prev
    if not gated:
        dV_z = db_z = None
    return dA, dV_h, db_h, dV_z, db_z, dh


def antisym_forward(p, x, eps, gamma, h0=None):
    return euler_forward(x, antisym_matrix(p["W"], gamma), p["V_h"], p["b_h"], eps, h0=h0)


def antisym_backward(p, cache, dh_T, eps, gamma):
    dA, dV_h, db_h, _, _, dh0 = euler_backward(cache, dh_T)
    return dict(W=antisym_dW(dA), V_h=dV_h, b_h=db_h), dh0


def antisym_gated_forward(p, x, eps, gamma, h0=None):
    return euler_forward(x, antisym_matrix(p["W"], gamma), p["V_h"], p["b_h"], eps,
                         V_z=p["V_z"], b_z=p["b_z"], h0=h0)


def antisym_gated_backward(p, cache, dh_T, eps, gamma):
    dA, dV_h, db_h, dV_z, db_z, dh0 = euler_backward(cache, dh_T)
    return dict(W=antisym_dW(dA), V_h=dV_h, b_h=db_h, V_z=dV_z, b_z=db_z), dh0


def ablation_forward(p, x, eps, gamma, h0=None):
    """(13) with W - W^T replaced by one unstructured W: A = W - gamma I (section 5.4)."""
    A = p["W"] - gamma * np.eye(p["W"].shape[0])
    return euler_forward(x, A, p["V_h"], p["b_h"], eps, V_z=p["V_z"], b_z=p["b_z"], h0=h0)


def ablation_backward(p, cache, dh_T, eps, gamma):
    dA, dV_h, db_h, dV_z, db_z, dh0 = euler_backward(cache, dh_T)
    return dict(W=dA, V_h=dV_h, b_h=db_h, V_z=dV_z, b_z=db_z), dh0


def feedback_forward(p, x, eps, gamma=0.0, h0=None):
    """Section 4's RNN with feedback: h_t = h_{t-1} + eps tanh(W h_{t-1} + V_h x_t + b_h)."""
    return euler_forward(x, p["W"], p["V_h"], p["b_h"], eps, h0=h0)


def feedback_backward(p, cache, dh_T, eps, gamma=0.0):
    dA, dV_h, db_h, _, _, dh0 = euler_backward(cache, dh_T)
    return dict(W=dA, V_h=dV_h, b_h=db_h), dh0


# ---------------------------------------------------------------------------------------------
# Readout: logits = W_out h_T + b_out, softmax cross-entropy averaged over the batch.
# ---------------------------------------------------------------------------------------------

def readout_loss(h, W_out, b_out, y):
    """Returns (loss, logits, cache)."""
    logits = h @ W_out.T + b_out                        # (B, K)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    B = h.shape[0]
    loss = -log_p[np.arange(B), y].mean()
    return loss, logits, dict(h=h, W_out=W_out, p=np.exp(log_p), y=y)


def readout_backward(cache):
    """Returns (dW_out, db_out, dh)."""
    h, W_out, p, y = cache["h"], cache["W_out"], cache["p"], cache["y"]
    B = h.shape[0]
    # forward was: loss = mean_b -log p[b, y_b],  p = softmax(logits)
    dlogits = p.copy()
    dlogits[np.arange(B), y] -= 1.0
    dlogits /= B
    # forward was: logits = h W_out^T + b_out
    return dlogits.T @ h, dlogits.sum(axis=0), dlogits @ W_out
