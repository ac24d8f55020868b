"""The oracle: every cell's forward pass and BPTT in plain float64 NumPy, obvious and slow.

Nothing here is optimised. Each function follows its equation line by line, loops over time in
Python and keeps every intermediate, so that a reader can check it against the paper by eye and the
kernels (`nprnn/kernels/`) can be checked against it by a test. The finite-difference tests check
*this* file; the kernel tests check the kernels against this file.

Conventions (as in the paper): B batch, T time, m input size, n hidden size, K classes
(or outputs, for the mean squared error).
Inputs are batch-major here, x: (B, T, m); h_0 = 0 unless `h0` is given.
Each `<cell>_forward(p, x, ...)` returns (h_T, cache); each `<cell>_backward(p, cache, dh_T, ...)`
returns (grads, dh_0), grads having the same keys as p. Whatever precision the caller's arrays
have, the arithmetic is float64: the functions convert p and x first (`_float64`).
"""
import numpy as np


def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _float64(p, x=None):
    """p with every array as float64 (and x, if given): (p, x), or p alone."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}
    return p if x is None else (p, np.asarray(x, dtype=np.float64))


def _h0(x, n, h0):
    return np.zeros((x.shape[0], n)) if h0 is None else np.array(h0, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The Euler ("feedback") family: antisym (eq. 12), antisym-gated (eq. 13), ablation (section
# 5.4), feedback (section 4).
# All are h_t = h_{t-1} + eps * [z_t o] tanh(A h_{t-1} + V_h x_t + b_h) with a different
# recurrent matrix A built from the parameter W; only the gated ones have z_t. antisym-xgate (not
# in the paper) is antisym-gated with a gate of x_t alone: z_t = sigmoid(V_z x_t + b_z).
# ---------------------------------------------------------------------------------------------

def antisym_matrix(W, gamma):
    """A = W - W^T - gamma I: antisymmetric up to the diffusion term (eq. 12; the paper's W_h is
    our W)."""
    return W - W.T - gamma * np.eye(W.shape[0])


def antisym_dW(dA, w_form="triangle"):
    """A = W - W^T - gamma I  =>  dL/dW_ij = dA_ij - dA_ji, kept on the strict upper triangle
    (w_form "triangle", W strictly upper triangular) or everywhere ("full", a full W)."""
    return np.triu(dA - dA.T, k=1) if w_form == "triangle" else dA - dA.T


def euler_forward(x, A, V_h, b_h, eps, V_z=None, b_z=None, h0=None, gate_reads_h=True):
    """(12)/(13): h_t = h_{t-1} + eps * z_t * tanh(A h_{t-1} + V_h x_t + b_h),
    z_t = sigmoid(A h_{t-1} + V_z x_t + b_z) when gated (without A h_{t-1} where not
    gate_reads_h), else z_t = 1."""
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
            zp = x_t @ V_z.T + b_z
            if gate_reads_h:
                zp = zp + h @ A.T
            z = sigmoid(zp)                           # (B, n)
        else:
            z = np.ones_like(th)
        h = h + eps * z * th
        hs.append(h)
        ths.append(th)
        zs.append(z)
    return h, dict(x=x, A=A, hs=hs, ths=ths, zs=zs, gated=gated, eps=eps,
                   gate_reads_h=gate_reads_h)


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
        # so:          dh_prev = dh (+ the terms below) ;  dth = dh * eps * z
        dth = dh * eps * z
        # forward was: th = tanh(a),  a = A h_prev + V_h x_t + b_h
        # so:          da = dth * (1 - th**2) ;  dh_prev += da A ;  dA += da^T h_prev ; ...
        da = dth * (1.0 - th ** 2)
        dh_prev = dh + da @ A
        dA += da.T @ h_prev
        dV_h += da.T @ x_t
        db_h += da.sum(axis=0)
        if gated:
            # forward was: z = sigmoid(zp),  zp = [A h_prev +] V_z x_t + b_z
            # so:          dz = dh * eps * th ;  dzp = dz * z (1 - z) ;  [dh_prev += dzp A ; ...]
            dzp = dh * eps * th * z * (1.0 - z)
            if cache["gate_reads_h"]:
                dh_prev += dzp @ A
                dA += dzp.T @ h_prev
            dV_z += dzp.T @ x_t
            db_z += dzp.sum(axis=0)
        dh = dh_prev
    if not gated:
        dV_z = db_z = None
    return dA, dV_h, db_h, dV_z, db_z, dh


def antisym_forward(p, x, eps, gamma, h0=None):
    p, x = _float64(p, x)
    return euler_forward(x, antisym_matrix(p["W"], gamma), p["V_h"], p["b_h"], eps, h0=h0)


def antisym_backward(p, cache, dh_T, eps, gamma, w_form="triangle"):
    dA, dV_h, db_h, _, _, dh0 = euler_backward(cache, dh_T)
    return dict(W=antisym_dW(dA, w_form), V_h=dV_h, b_h=db_h), dh0


def antisym_gated_forward(p, x, eps, gamma, h0=None):
    p, x = _float64(p, x)
    return euler_forward(x, antisym_matrix(p["W"], gamma), p["V_h"], p["b_h"], eps,
                         V_z=p["V_z"], b_z=p["b_z"], h0=h0)


def antisym_gated_backward(p, cache, dh_T, eps, gamma, w_form="triangle"):
    dA, dV_h, db_h, dV_z, db_z, dh0 = euler_backward(cache, dh_T)
    return dict(W=antisym_dW(dA, w_form), V_h=dV_h, b_h=db_h, V_z=dV_z, b_z=db_z), dh0


def antisym_xgate_forward(p, x, eps, gamma, h0=None):
    """antisym-gated with z_t = sigmoid(V_z x_t + b_z): a gate of x_t alone (not in the paper)."""
    p, x = _float64(p, x)
    return euler_forward(x, antisym_matrix(p["W"], gamma), p["V_h"], p["b_h"], eps,
                         V_z=p["V_z"], b_z=p["b_z"], h0=h0, gate_reads_h=False)


def ablation_forward(p, x, eps, gamma, h0=None):
    """(13) with W - W^T replaced by one unstructured W: A = W - gamma I (section 5.4)."""
    p, x = _float64(p, x)
    A = p["W"] - gamma * np.eye(p["W"].shape[0])
    return euler_forward(x, A, p["V_h"], p["b_h"], eps, V_z=p["V_z"], b_z=p["b_z"], h0=h0)


def ablation_backward(p, cache, dh_T, eps, gamma):
    dA, dV_h, db_h, dV_z, db_z, dh0 = euler_backward(cache, dh_T)
    return dict(W=dA, V_h=dV_h, b_h=db_h, V_z=dV_z, b_z=db_z), dh0


def feedback_forward(p, x, eps, gamma=0.0, h0=None):
    """Section 4's RNN with feedback, h_t = h_{t-1} + eps tanh(W h_{t-1}), with the input terms
    of (12) added: h_t = h_{t-1} + eps tanh(W h_{t-1} + V_h x_t + b_h)."""
    p, x = _float64(p, x)
    return euler_forward(x, p["W"], p["V_h"], p["b_h"], eps, h0=h0)


def feedback_backward(p, cache, dh_T, eps, gamma=0.0):
    dA, dV_h, db_h, _, _, dh0 = euler_backward(cache, dh_T)
    return dict(W=dA, V_h=dV_h, b_h=db_h), dh0


# ---------------------------------------------------------------------------------------------
# Readout: logits = W_out h_T + b_out, softmax cross-entropy averaged over the batch.
# ---------------------------------------------------------------------------------------------

def readout_loss(h, W_out, b_out, y):
    """Returns (loss, logits, cache)."""
    h, W_out, b_out = (np.asarray(a, dtype=np.float64) for a in (h, W_out, b_out))
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
    # so:          dloss/dlogits[b, k] = (p[b, k] - [k = y_b]) / B   (the mean divides by B)
    dlogits = p.copy()
    dlogits[np.arange(B), y] -= 1.0
    dlogits /= B
    # forward was: logits = h W_out^T + b_out
    return dlogits.T @ h, dlogits.sum(axis=0), dlogits @ W_out


# Readout for regression: out = W_out h_T + b_out, mean squared error over all B K entries
# (torch.nn.functional.mse_loss(out, y), reduction "mean"); y (B, K) real targets.

def readout_mse_loss(h, W_out, b_out, y):
    """Returns (loss, out, cache)."""
    h, W_out, b_out, y = (np.asarray(a, dtype=np.float64) for a in (h, W_out, b_out, y))
    out = h @ W_out.T + b_out                           # (B, K)
    loss = ((out - y) ** 2).mean()
    return loss, out, dict(h=h, W_out=W_out, out=out, y=y)


def readout_mse_backward(cache):
    """Returns (dW_out, db_out, dh)."""
    h, W_out, out, y = cache["h"], cache["W_out"], cache["out"], cache["y"]
    # forward was: loss = mean over b, k of (out[b, k] - y[b, k])^2   (B K entries)
    # so:          dloss/dout[b, k] = 2 (out[b, k] - y[b, k]) / (B K)
    dout = 2.0 * (out - y) / out.size
    # forward was: out = h W_out^T + b_out
    return dout.T @ h, dout.sum(axis=0), dout @ W_out


# ---------------------------------------------------------------------------------------------
# Baselines: vanilla RNN, LSTM, peephole LSTM, GRU. Parameter names and layouts are PyTorch's
# single-layer nn.RNN / nn.LSTM / nn.GRU: the gate blocks (n rows each) are stacked along the
# rows of weight_ih (kn, m), weight_hh (kn, n), bias_ih (kn,), bias_hh (kn,) in the order named
# below, and both biases are kept, so weights can be exchanged with PyTorch.
# h_0 = 0 unless `h0` is given; for the LSTMs `h0` sets h_0 only and the cell state starts at
# c_0 = 0, and the dh_0 returned by the backward functions is dL/dh_0.
# ---------------------------------------------------------------------------------------------

def _zero_grads(p):
    return {k: np.zeros(np.shape(v)) for k, v in p.items()}


def rnn_forward(p, x, h0=None):
    """h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)."""
    p, x = _float64(p, x)
    B, T, m = x.shape
    n = p["weight_hh"].shape[0]
    h = _h0(x, n, h0)
    hs = [h]
    for t in range(T):
        a = x[:, t, :] @ p["weight_ih"].T + p["bias_ih"] + h @ p["weight_hh"].T + p["bias_hh"]
        h = np.tanh(a)                                # (B, n)
        hs.append(h)
    return h, dict(x=x, hs=hs)


def rnn_backward(p, cache, dh_T):
    p = _float64(p)
    x, hs = cache["x"], cache["hs"]
    B, T, m = x.shape
    grads = _zero_grads(p)
    dh = np.array(dh_T, dtype=np.float64)
    for t in reversed(range(T)):
        # forward was: h_t = tanh(a),  a = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh
        da = dh * (1.0 - hs[t + 1] ** 2)              # (B, n)
        grads["weight_ih"] += da.T @ x[:, t, :]
        grads["weight_hh"] += da.T @ hs[t]
        grads["bias_ih"] += da.sum(axis=0)
        grads["bias_hh"] += da.sum(axis=0)
        dh = da @ p["weight_hh"]
    return grads, dh


def _lstm_forward(p, x, h0, peephole, c0=None):
    """Gate order i, f, g, o (PyTorch's):
        a = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh,  split into a_i, a_f, a_g, a_o   (B, n) each
        i = sigmoid(a_i [+ w_ci o c_{t-1}]),  f = sigmoid(a_f [+ w_cf o c_{t-1}]),  g = tanh(a_g)
        c_t = f o c_{t-1} + i o g
        o = sigmoid(a_o [+ w_co o c_t])        (the peephole output gate sees the NEW cell state)
        h_t = o o tanh(c_t)
    The bracketed terms are the peepholes (peephole=True). c0 (B, n): c_0 (None: 0)."""
    p, x = _float64(p, x)
    B, T, m = x.shape
    n = p["weight_hh"].shape[1]
    h = _h0(x, n, h0)
    c = np.zeros((B, n)) if c0 is None else np.array(c0, dtype=np.float64)
    hs, cs, gates = [h], [c], []
    for t in range(T):
        a = x[:, t, :] @ p["weight_ih"].T + p["bias_ih"] + h @ p["weight_hh"].T + p["bias_hh"]
        a_i, a_f, a_g, a_o = np.split(a, 4, axis=1)
        if peephole:
            a_i = a_i + p["w_ci"] * c
            a_f = a_f + p["w_cf"] * c
        i, f, g = sigmoid(a_i), sigmoid(a_f), np.tanh(a_g)
        c = f * c + i * g
        if peephole:
            a_o = a_o + p["w_co"] * c
        o = sigmoid(a_o)
        h = o * np.tanh(c)
        hs.append(h)
        cs.append(c)
        gates.append((i, f, g, o))
    return h, dict(x=x, hs=hs, cs=cs, gates=gates, peephole=peephole)


def _lstm_backward(p, cache, dh_T, dc_T=None):
    """(grads, dL/dh_0) from dL/dh_T and dL/dc_T (None: 0); dL/dc_0 goes to cache["dc0"]."""
    p = _float64(p)
    x, hs, cs, gates, peephole = (cache[k] for k in ("x", "hs", "cs", "gates", "peephole"))
    B, T, m = x.shape
    grads = _zero_grads(p)
    dh = np.array(dh_T, dtype=np.float64)
    dc = np.zeros_like(dh) if dc_T is None else np.array(dc_T, dtype=np.float64)
    for t in reversed(range(T)):
        i, f, g, o = gates[t]
        c, c_prev = cs[t + 1], cs[t]
        tc = np.tanh(c)
        # forward was: h_t = o * tanh(c_t)
        # so:          do = dh_t tanh(c_t) ;  dL/dc_t = (the part through c_{t+1}, in dc)
        #                                             + dh_t o (1 - tanh(c_t)**2)
        do = dh * tc
        dc = dc + dh * o * (1.0 - tc ** 2)
        # forward was: o = sigmoid(a_o [+ w_co * c_t])
        da_o = do * o * (1.0 - o)
        if peephole:
            dc = dc + da_o * p["w_co"]
            grads["w_co"] += (da_o * c).sum(axis=0)
        # forward was: c_t = f * c_{t-1} + i * g
        di, df, dg, dc_prev = dc * g, dc * c_prev, dc * i, dc * f
        # forward was: i = sigmoid(a_i [+ w_ci c_{t-1}]), f = sigmoid(a_f [+ w_cf c_{t-1}]),
        #              g = tanh(a_g)
        da_i = di * i * (1.0 - i)
        da_f = df * f * (1.0 - f)
        da_g = dg * (1.0 - g ** 2)
        if peephole:
            dc_prev = dc_prev + da_i * p["w_ci"] + da_f * p["w_cf"]
            grads["w_ci"] += (da_i * c_prev).sum(axis=0)
            grads["w_cf"] += (da_f * c_prev).sum(axis=0)
        # forward was: a = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh
        da = np.concatenate([da_i, da_f, da_g, da_o], axis=1)     # (B, 4n)
        grads["weight_ih"] += da.T @ x[:, t, :]
        grads["weight_hh"] += da.T @ hs[t]
        grads["bias_ih"] += da.sum(axis=0)
        grads["bias_hh"] += da.sum(axis=0)
        dh = da @ p["weight_hh"]
        dc = dc_prev
    cache["dc0"] = dc
    return grads, dh


def lstm_forward(p, x, h0=None, c0=None):
    """Standard LSTM (no peepholes), PyTorch's nn.LSTM; see `_lstm_forward`."""
    return _lstm_forward(p, x, h0, peephole=False, c0=c0)


def lstm_backward(p, cache, dh_T, dc_T=None):
    return _lstm_backward(p, cache, dh_T, dc_T)


def peephole_lstm_forward(p, x, h0=None, c0=None):
    """LSTM with peepholes w_ci, w_cf (on c_{t-1}) and w_co (on c_t); see `_lstm_forward`."""
    return _lstm_forward(p, x, h0, peephole=True, c0=c0)


def peephole_lstm_backward(p, cache, dh_T, dc_T=None):
    return _lstm_backward(p, cache, dh_T, dc_T)


def gru_forward(p, x, h0=None):
    """PyTorch's nn.GRU, gate order r, z, n:
        r = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
        z = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
        n_t = tanh(W_in x_t + b_in + r o (W_hn h_{t-1} + b_hn))
        h_t = (1 - z) o n_t + z o h_{t-1}"""
    p, x = _float64(p, x)
    B, T, m = x.shape
    n = p["weight_hh"].shape[1]
    h = _h0(x, n, h0)
    hs, steps = [h], []
    for t in range(T):
        gi = x[:, t, :] @ p["weight_ih"].T + p["bias_ih"]        # (B, 3n)
        gh = h @ p["weight_hh"].T + p["bias_hh"]                 # (B, 3n)
        gi_r, gi_z, gi_n = np.split(gi, 3, axis=1)
        gh_r, gh_z, gh_n = np.split(gh, 3, axis=1)
        r = sigmoid(gi_r + gh_r)
        z = sigmoid(gi_z + gh_z)
        n_t = np.tanh(gi_n + r * gh_n)
        h = (1.0 - z) * n_t + z * h
        hs.append(h)
        steps.append((r, z, n_t, gh_n))
    return h, dict(x=x, hs=hs, steps=steps)


def gru_backward(p, cache, dh_T):
    p = _float64(p)
    x, hs, steps = cache["x"], cache["hs"], cache["steps"]
    B, T, m = x.shape
    grads = _zero_grads(p)
    dh = np.array(dh_T, dtype=np.float64)
    for t in reversed(range(T)):
        r, z, n_t, gh_n = steps[t]
        h_prev = hs[t]
        # forward was: h_t = (1 - z) * n_t + z * h_{t-1}
        dn = dh * (1.0 - z)
        dz = dh * (h_prev - n_t)
        dh_prev = dh * z
        # forward was: n_t = tanh(gi_n + r * gh_n)
        da_n = dn * (1.0 - n_t ** 2)
        dr = da_n * gh_n
        dgh_n = da_n * r
        # forward was: r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z)
        da_r = dr * r * (1.0 - r)
        da_z = dz * z * (1.0 - z)
        # forward was: gi = W_ih x_t + b_ih,  gh = W_hh h_{t-1} + b_hh
        dgi = np.concatenate([da_r, da_z, da_n], axis=1)         # (B, 3n)
        dgh = np.concatenate([da_r, da_z, dgh_n], axis=1)        # (B, 3n)
        grads["weight_ih"] += dgi.T @ x[:, t, :]
        grads["bias_ih"] += dgi.sum(axis=0)
        grads["weight_hh"] += dgh.T @ h_prev
        grads["bias_hh"] += dgh.sum(axis=0)
        dh = dh_prev + dgh @ p["weight_hh"]
    return grads, dh


# ---------------------------------------------------------------------------------------------
# The successors of AntisymmetricRNN, as their official code computes them: coRNN (Rusch &
# Mishra, ICLR 2021) and LEM (Rusch, Mishra, Erichson & Mahoney, ICLR 2022). Each has two states
# of n units: y, which the readout reads (the `hs` of the other cells), and z, internal, as an
# LSTM's c is: z_0 = 0 always, `h0` sets y_0 only, and the dh_0 returned is dL/dy_0.
# ---------------------------------------------------------------------------------------------

def cornn_forward(p, x, dt, gamma, epsilon, h0=None, imex=False, z0=None):
    """coRNN (parameters W, W_z (n, n), V (n, m), b (n,)):
        s_t = tanh(W y_{t-1} + W_z z_{t-1} + V x_t + b)
        z_t = z_{t-1} + dt (s_t - gamma y_{t-1} - epsilon z_{t-1})      (the official code)
        z_t = (z_{t-1} + dt (s_t - gamma y_{t-1})) / (1 + dt epsilon)  (imex: the paper's eq. 3)
        y_t = y_{t-1} + dt z_t
    from y_0 = h0 and z_0 = z0 (None: 0)."""
    p, x = _float64(p, x)
    B, T, m = x.shape
    n = p["W"].shape[0]
    y, z = _h0(x, n, h0), _h0(x, n, z0)
    hs, zs, ss = [y], [z], []
    for t in range(T):
        s = np.tanh(y @ p["W"].T + z @ p["W_z"].T + x[:, t, :] @ p["V"].T + p["b"])   # (B, n)
        if imex:
            z = (z + dt * (s - gamma * y)) / (1.0 + dt * epsilon)
        else:
            z = z + dt * (s - gamma * y - epsilon * z)
        y = y + dt * z
        hs.append(y)
        zs.append(z)
        ss.append(s)
    return y, dict(x=x, hs=hs, zs=zs, ss=ss, imex=imex)


def cornn_imex_forward(p, x, dt, gamma, epsilon, h0=None, z0=None):
    """coRNN in the paper's IMEX form (see cornn_forward)."""
    return cornn_forward(p, x, dt, gamma, epsilon, h0=h0, imex=True, z0=z0)


def cornn_backward(p, cache, dh_T, dt, gamma, epsilon, dz_T=None):
    """BPTT through cornn_forward (either form: the cache says which) from dL/dy_T and dL/dz_T
    (None: 0); dL/dz_0 goes to cache["dz0"]."""
    p = _float64(p)
    x, hs, zs, ss, imex = (cache[k] for k in ("x", "hs", "zs", "ss", "imex"))
    grads = _zero_grads(p)
    dy = np.array(dh_T, dtype=np.float64)
    dz = np.zeros_like(dy) if dz_T is None else np.array(dz_T, dtype=np.float64)
    for t in reversed(range(x.shape[1])):
        # forward was: y_t = y_{t-1} + dt z_t
        # so:          dL/dz_t = dz + dt dy ;  dy_{t-1} = dy + ...
        dz = dz + dt * dy
        if imex:
            # forward was: z_t = (z_{t-1} + dt (s_t - gamma y_{t-1})) / (1 + dt epsilon)
            d = 1.0 + dt * epsilon
            ds, dy_prev, dz_prev = dz * dt / d, dy - dz * dt * gamma / d, dz / d
        else:
            # forward was: z_t = z_{t-1} + dt (s_t - gamma y_{t-1} - epsilon z_{t-1})
            ds, dy_prev, dz_prev = dz * dt, dy - dz * dt * gamma, dz * (1.0 - dt * epsilon)
        # forward was: s_t = tanh(a_t),  a_t = W y_{t-1} + W_z z_{t-1} + V x_t + b
        da = ds * (1.0 - ss[t] ** 2)                  # (B, n)
        grads["W"] += da.T @ hs[t]
        grads["W_z"] += da.T @ zs[t]
        grads["V"] += da.T @ x[:, t, :]
        grads["b"] += da.sum(axis=0)
        dy = dy_prev + da @ p["W"]
        dz = dz_prev + da @ p["W_z"]
    cache["dz0"] = dz
    return grads, dy


def lem_forward(p, x, dt, h0=None, z0=None):
    """LEM, in the official layout (weight_ih (4n, m), bias_ih (4n,): y's gate, z's gate, the
    input terms of y's and of z's candidate; weight_hh (3n, n), bias_hh (3n,) on y_{t-1}: y's
    gate, z's gate, z's candidate; weight_z (n, n), bias_z (n,) on the NEW z_t):
        [A1 | A2 | A3 | A4] = weight_ih x_t + bias_ih
        [H1 | H2 | H3] = weight_hh y_{t-1} + bias_hh
        gbar_t = dt sigmoid(A1 + H1)                                     (y's step)
        g_t = dt sigmoid(A2 + H2)                                        (z's step)
        z_t = (1 - g_t) z_{t-1} + g_t tanh(A4 + H3)
        y_t = (1 - gbar_t) y_{t-1} + gbar_t tanh(weight_z z_t + bias_z + A3)"""
    p, x = _float64(p, x)
    B, T, m = x.shape
    n = p["weight_z"].shape[0]
    y, z = _h0(x, n, h0), _h0(x, n, z0)             # y_0, z_0 (None: 0)
    hs, zs, steps = [y], [z], []
    for t in range(T):
        A1, A2, A3, A4 = np.split(x[:, t, :] @ p["weight_ih"].T + p["bias_ih"], 4, axis=1)
        H1, H2, H3 = np.split(y @ p["weight_hh"].T + p["bias_hh"], 3, axis=1)
        sy = sigmoid(A1 + H1)                         # y's gate: gbar_t = dt sy
        sz = sigmoid(A2 + H2)                         # z's gate: g_t = dt sz
        cz = np.tanh(A4 + H3)
        z = (1.0 - dt * sz) * z + dt * sz * cz
        cy = np.tanh(z @ p["weight_z"].T + p["bias_z"] + A3)
        y = (1.0 - dt * sy) * y + dt * sy * cy
        hs.append(y)
        zs.append(z)
        steps.append((sy, sz, cy, cz))
    return y, dict(x=x, hs=hs, zs=zs, steps=steps)


def lem_backward(p, cache, dh_T, dt, dz_T=None):
    """BPTT through lem_forward from dL/dy_T and dL/dz_T (None: 0); dL/dz_0 goes to
    cache["dz0"]."""
    p = _float64(p)
    x, hs, zs, steps = cache["x"], cache["hs"], cache["zs"], cache["steps"]
    grads = _zero_grads(p)
    dy = np.array(dh_T, dtype=np.float64)
    dz = np.zeros_like(dy) if dz_T is None else np.array(dz_T, dtype=np.float64)
    for t in reversed(range(x.shape[1])):
        sy, sz, cy, cz = steps[t]
        y_prev, z_prev, z = hs[t], zs[t], zs[t + 1]
        # forward was: y_t = (1 - dt sy) y_{t-1} + dt sy cy,  sy = sigmoid(A1 + H1),
        #              cy = tanh(weight_z z_t + bias_z + A3)
        # so:          da1 = dy dt (cy - y_{t-1}) sy (1 - sy) ;  dq = dy dt sy (1 - cy**2)
        #              dz_t += dq weight_z ;  dy_{t-1} = dy (1 - dt sy) + ...
        da1 = dy * dt * (cy - y_prev) * sy * (1.0 - sy)
        dq = dy * dt * sy * (1.0 - cy ** 2)
        dz = dz + dq @ p["weight_z"]
        grads["weight_z"] += dq.T @ z
        grads["bias_z"] += dq.sum(axis=0)
        # forward was: z_t = (1 - dt sz) z_{t-1} + dt sz cz,  sz = sigmoid(A2 + H2),
        #              cz = tanh(A4 + H3)
        # so:          da2 = dz dt (cz - z_{t-1}) sz (1 - sz) ;  da4 = dz dt sz (1 - cz**2)
        #              dz_{t-1} = dz (1 - dt sz)
        da2 = dz * dt * (cz - z_prev) * sz * (1.0 - sz)
        da4 = dz * dt * sz * (1.0 - cz ** 2)
        # forward was: [A1|A2|A3|A4] = weight_ih x_t + bias_ih,
        #              [H1|H2|H3] = weight_hh y_{t-1} + bias_hh
        dA = np.concatenate([da1, da2, dq, da4], axis=1)              # (B, 4n)
        dH = np.concatenate([da1, da2, da4], axis=1)                  # (B, 3n)
        grads["weight_ih"] += dA.T @ x[:, t, :]
        grads["bias_ih"] += dA.sum(axis=0)
        grads["weight_hh"] += dH.T @ y_prev
        grads["bias_hh"] += dH.sum(axis=0)
        dy = dy * (1.0 - dt * sy) + dH @ p["weight_hh"]
        dz = dz * (1.0 - dt * sz)
    cache["dz0"] = dz
    return grads, dy


# ---------------------------------------------------------------------------------------------
# Sequences: lengths, gradients at every step, stacked layers, by their definitions. Built on a
# cell's functions above and nothing else, so that they check the kernels' handling of each
# (kernels/common.py, "Sequences"; kernels/stack.py) independently of it. Slow: they rerun the
# cell per row and per step.
# ---------------------------------------------------------------------------------------------

def stacked_forward(forward, ps, x, lengths=None):
    """The top layer's states h_1 .. h_T (B, T, n) over x (B, T, m): each row alone, cut at its
    length (lengths (B,), None: all T), through the layers' parameters `ps` in turn, layer
    k + 1 reading layer k's hidden sequence; past a row's length its last state holds.
    forward(p, x): a cell's forward function (its hyperparameters bound)."""
    B, T, _ = x.shape
    out = []
    for b in range(B):
        L = T if lengths is None else int(lengths[b])
        seq = np.asarray(x[b:b + 1, :L], dtype=np.float64)
        for p in ps:
            _, cache = forward(p, seq)
            seq = np.stack(cache["hs"][1:], axis=1)          # (1, L, n)
        out.append(np.concatenate([seq[0], np.repeat(seq[0, -1:], T - L, axis=0)]))
    return np.stack(out)


def sequence_backward(forward, backward, p, x, dhs, dh_T=None, lengths=None):
    """The gradients of L = sum_t <dhs[:, t], h_t> + <dh_T, h_T> w.r.t. p, for one layer over
    x (B, T, m) with lengths (B,) (None: all T), by superposition: each row's h_t with t <= its
    length is the last state of the row cut at t, so each term is one backward of that cut
    sequence (a state past the length is the one at it). Returns grads with the keys of p.
    backward(p, cache, dh_T): a cell's backward function (its hyperparameters bound)."""
    B, T = dhs.shape[0], dhs.shape[1]
    grads = {k: np.zeros(np.shape(v)) for k, v in p.items()}
    for b in range(B):
        L = T if lengths is None else int(lengths[b])
        g = np.array(dhs[b], dtype=np.float64)              # (T, n): dL/dh_t of row b
        g[L - 1] += g[L:].sum(axis=0) + (0.0 if dh_T is None else dh_T[b])
        for t in range(1, L + 1):
            _, cache = forward(p, x[b:b + 1, :t])
            step, _ = backward(p, cache, g[t - 1][None, :])
            for k in grads:
                grads[k] += step[k]
    return grads
