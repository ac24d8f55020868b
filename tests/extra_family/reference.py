"""The leaky tanh cell's oracle, in plain float64 NumPy (the form of nprnn/core/reference.py):

    y_t = tanh(W h_{t-1} + V_h x_t + b_h)
    h_t = h_{t-1} + alpha (y_t - h_{t-1})  =  (1 - alpha) h_{t-1} + alpha y_t

Inputs are batch-major, x (B, T, m); h_0 = 0 unless `h0` is given. leaky_forward returns
(h_T, cache), leaky_backward (grads, dh_0), grads with the keys of p.
"""
import numpy as np


def leaky_forward(p, x, alpha, h0=None):
    p = {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}
    x = np.asarray(x, dtype=np.float64)
    B, T, m = x.shape
    n = p["W"].shape[0]
    h = np.zeros((B, n)) if h0 is None else np.array(h0, dtype=np.float64)
    hs, ys = [h], []
    for t in range(T):
        y = np.tanh(h @ p["W"].T + x[:, t, :] @ p["V_h"].T + p["b_h"])      # (B, n)
        h = h + alpha * (y - h)
        hs.append(h)
        ys.append(y)
    return h, dict(x=x, hs=hs, ys=ys)


def leaky_backward(p, cache, dh_T, alpha):
    p = {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}
    x, hs, ys = cache["x"], cache["hs"], cache["ys"]
    grads = {k: np.zeros(v.shape) for k, v in p.items()}
    dh = np.array(dh_T, dtype=np.float64)
    for t in reversed(range(x.shape[1])):
        # forward was: h_t = (1 - alpha) h_{t-1} + alpha y_t,  y_t = tanh(a_t)
        # so:          da_t = dh_t alpha (1 - y_t**2) ;  dh_{t-1} = (1 - alpha) dh_t + da_t W
        da = dh * alpha * (1.0 - ys[t] ** 2)                                # (B, n)
        grads["W"] += da.T @ hs[t]
        grads["V_h"] += da.T @ x[:, t, :]
        grads["b_h"] += da.sum(axis=0)
        dh = (1.0 - alpha) * dh + da @ p["W"]
    return grads, dh
