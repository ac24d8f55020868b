"""The readout on top of every cell: a linear layer on h_T, then a loss, softmax cross-entropy
(a classifier, loss="xent") or mean squared error (regression, loss="mse").

    logits = h_T W_out^T + b_out                     h_T (B, n), W_out (K, n), b_out (K,)
    p      = softmax(logits)                         (B, K)
    loss   = (1/B) sum_b -log p[b, y_b]              (section 5: "the last hidden state h_T ...
                                                      into a fully-connected layer and a softmax")
Backward:
    dlogits = (p - onehot(y)) / B
    dW_out  = dlogits^T h_T ;  db_out = sum_b dlogits ;  dh_T = dlogits W_out

Mean squared error: the same linear layer gives the outputs, with no softmax, and y (B, K) holds
real targets (the mean over all B K entries, torch.nn.functional.mse_loss's reduction="mean"):
    out    = h_T W_out^T + b_out                     (B, K)
    loss   = (1/(B K)) sum_b sum_k (out[b, k] - y[b, k])^2
Backward:
    dout   = 2 (out - y) / (B K)                     then dW_out, db_out, dh_T as above
"""
import math

import numpy as np

from .common import Twins, njit, njit_inline
from .gpu_common import cdiv, cuda, step_grid


def softmax_xent_row(losses, dlogits, logits, y, b):
    """Row b: losses[b] = -log p[b, y_b], dlogits[b] = (p[b] - onehot(y_b)) / B (written, =),
    with the row's maximum subtracted before exp and the sum of exps taken in float64.

    Written once for both twins: it takes arrays, so it is compiled twice from this source, with
    njit for the CPU twin and as a CUDA device function for the GPU twin (an njit function cannot
    take the CUDA simulator's arrays)."""
    B, K = logits.shape
    mx = logits[b, 0]
    for k in range(1, K):
        mx = max(mx, logits[b, k])
    s = 0.0
    for k in range(K):
        s += math.exp(logits[b, k] - mx)
    log_s = math.log(s)
    losses[b] = log_s - (logits[b, y[b]] - mx)
    for k in range(K):
        dlogits[b, k] = math.exp(logits[b, k] - mx - log_s) / B
    dlogits[b, y[b]] -= 1.0 / B


def mse_row(losses, dout, out, y, b):
    """Row b: losses[b] = (1/K) sum_k (out[b, k] - y[b, k])^2, the row's mean, so that the mean of
    losses is the mean over all B K entries; dout[b] = 2 (out[b] - y[b]) / (B K) (written, =).
    In the arrays' dtype throughout. Written once for both twins, as softmax_xent_row."""
    B, K = out.shape
    f = losses.dtype.type                           # the dtype: no float64 arithmetic in float32
    acc = f(0)
    for k in range(K):
        e = out[b, k] - y[b, k]
        acc += e * e
    losses[b] = acc / f(K)
    scale = f(2) / f(B * K)
    for k in range(K):
        # forward was: loss = (1/(B K)) sum_b sum_k (out[b, k] - y[b, k])^2
        # so:          dout[b, k] = 2 (out[b, k] - y[b, k]) / (B K)
        dout[b, k] = scale * (out[b, k] - y[b, k])


softmax_xent_row_cpu = njit_inline(softmax_xent_row)
softmax_xent_row_gpu = cuda.jit(device=True)(softmax_xent_row)
mse_row_cpu = njit_inline(mse_row)
mse_row_gpu = cuda.jit(device=True)(mse_row)


@njit
def readout_forward_cpu(logits, h, W_out, b_out):
    """logits (B, K) written (=). h (B, n), W_out (K, n), b_out (K,) read."""
    np.dot(h, W_out.T, logits)
    logits += b_out


@njit
def softmax_xent_cpu(losses, dlogits, logits, y):
    """Per-row loss and the gradient of the *mean* loss w.r.t. the logits.

    Written (=): losses (B,) = -log p[b, y_b]; dlogits (B, K) = (p - onehot(y)) / B.
    Read: logits (B, K), y (B,) integer labels in [0, K).

    With p_bk = exp(l_bk) / sum_j exp(l_bj), loss_b = log sum_j exp(l_bj) - l_{b,y_b}, so
    d loss_b / d l_bk = p_bk - [k = y_b]; the mean over the batch divides that by B.
    """
    for b in range(logits.shape[0]):
        softmax_xent_row_cpu(losses, dlogits, logits, y, b)


@njit
def mse_cpu(losses, dout, out, y):
    """Per-row mean squared error and the gradient of the *mean over all B K entries* w.r.t. the
    outputs (torch.nn.functional.mse_loss(out, y), reduction "mean").

    Written (=): losses (B,) = (1/K) sum_k (out[b, k] - y[b, k])^2 (their mean is the loss);
    dout (B, K) = 2 (out - y) / (B K). Read: out (B, K), y (B, K) targets of out's dtype.
    """
    for b in range(out.shape[0]):
        mse_row_cpu(losses, dout, out, y, b)


@njit
def readout_backward_cpu(dW_out, db_out, dh, dlogits, h, W_out):
    """Written (=): dW_out (K, n), db_out (K,), dh (B, n) = dL/dh_T.
    Read: dlogits (B, K), h (B, n), W_out (K, n)."""
    # forward was: logits = h W_out^T + b_out
    # so:          dW_out = dlogits^T h ;  db_out = sum_b dlogits ;  dh = dlogits W_out
    np.dot(dlogits.T, h, dW_out)
    db_out[:] = dlogits.sum(axis=0)
    np.dot(dlogits, W_out, dh)


# ------------------------------------------------------------------------------------------
# GPU twins: one thread per output element, except the losses: K is small (10), so one thread
# per row does a whole softmax, or a row's squared errors. Host functions take the CPU twins'
# arguments (device arrays) and keyword-only launch options.
# ------------------------------------------------------------------------------------------

@cuda.jit
def readout_forward_kernel(logits, h, W_out, b_out):
    """logits[b, k] = sum_i h[b, i] W_out[k, i] + b_out[k] (written, =).
    One thread per (b, k); 2-d grid over (k, b)."""
    k, b = cuda.grid(2)
    B, K = logits.shape
    if b < B and k < K:
        acc = b_out[k]
        for i in range(h.shape[1]):
            acc += h[b, i] * W_out[k, i]
        logits[b, k] = acc


@cuda.jit
def softmax_xent_kernel(losses, dlogits, logits, y):
    """softmax_xent_row for row b: losses[b] = -log p[b, y_b], dlogits[b] = (p[b] - onehot) / B
    (written, =). One thread per row b."""
    b = cuda.grid(1)
    if b < logits.shape[0]:
        softmax_xent_row_gpu(losses, dlogits, logits, y, b)


@cuda.jit
def mse_kernel(losses, dout, out, y):
    """mse_row for row b: losses[b] = (1/K) sum_k (out[b, k] - y[b, k])^2,
    dout[b] = 2 (out[b] - y[b]) / (B K) (written, =). One thread per row b."""
    b = cuda.grid(1)
    if b < out.shape[0]:
        mse_row_gpu(losses, dout, out, y, b)


@cuda.jit
def readout_backward_kernel(dW_out, db_out, dh, dlogits, h, W_out):
    """forward was: logits = h W_out^T + b_out
    so:          dW_out = dlogits^T h (K, n) ;  db_out = sum_b dlogits (K,) ;
                 dh = dlogits W_out (B, n)                                   (all written, =)

    One thread per output element of all three: thread (c, r) of a 2-d grid over
    (n + 1 columns, max(B, K) rows) writes dW_out[r, c] (r < K, c < n), db_out[r] (r < K,
    c = n) and dh[r, c] (r < B, c < n).
    """
    c, r = cuda.grid(2)
    B, K = dlogits.shape
    n = h.shape[1]
    if r < K and c < n:
        acc = dW_out.dtype.type(0)
        for b in range(B):
            acc += dlogits[b, r] * h[b, c]
        dW_out[r, c] = acc
    if r < K and c == n:
        acc = db_out.dtype.type(0)
        for b in range(B):
            acc += dlogits[b, r]
        db_out[r] = acc
    if r < B and c < n:
        acc = dh.dtype.type(0)
        for k in range(K):
            acc += dlogits[r, k] * W_out[k, c]
        dh[r, c] = acc


def readout_forward_gpu(logits, h, W_out, b_out, *, block=(16, 16)):
    """Twin of readout_forward_cpu (device arrays): logits (B, K) written (=)."""
    B, K = logits.shape
    grid, block = step_grid(B, K, block)          # (K, B) over (x, y); B checked against y's limit
    readout_forward_kernel[grid, block](logits, h, W_out, b_out)


def softmax_xent_gpu(losses, dlogits, logits, y, *, threads=128):
    """Twin of softmax_xent_cpu (device arrays): losses (B,), dlogits (B, K) written (=)."""
    B = logits.shape[0]
    softmax_xent_kernel[cdiv(B, threads), threads](losses, dlogits, logits, y)


def mse_gpu(losses, dout, out, y, *, threads=128):
    """Twin of mse_cpu (device arrays): losses (B,), dout (B, K) written (=)."""
    B = out.shape[0]
    mse_kernel[cdiv(B, threads), threads](losses, dout, out, y)


def readout_backward_gpu(dW_out, db_out, dh, dlogits, h, W_out, *, block=(32, 8)):
    """Twin of readout_backward_cpu (device arrays): dW_out, db_out, dh written (=)."""
    B, K = dlogits.shape
    n = h.shape[1]
    grid, block = step_grid(max(B, K), n + 1, block)     # (n + 1, max(B, K)) over (x, y)
    readout_backward_kernel[grid, block](dW_out, db_out, dh, dlogits, h, W_out)


# the twins, as nprnn/core/backends.py runs them, with their GPU launch settings
readout_forward = Twins(readout_forward_cpu, readout_forward_gpu,
                        gpu_options=lambda launch: dict(block=launch.readout_block))
softmax_xent = Twins(softmax_xent_cpu, softmax_xent_gpu,
                     gpu_options=lambda launch: dict(threads=launch.readout_block[0]))
mse = Twins(mse_cpu, mse_gpu,
            gpu_options=lambda launch: dict(threads=launch.readout_block[0]))
readout_backward = Twins(readout_backward_cpu, readout_backward_gpu,
                         gpu_options=lambda launch: dict(block=launch.readout_block))
