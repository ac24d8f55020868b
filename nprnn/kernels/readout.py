"""The readout on top of every cell: a linear layer on h_T (or on every h_t), then a loss,
softmax cross-entropy (a classifier, loss="xent") or mean squared error (regression, loss="mse").

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

The loss kernels work on rows: the B rows of h_T, or with a readout at every step the T*B rows of
h_1 .. h_T (time-major, row t B + b). Each row r has a weight w[r] (float64), its share of the
mean: 1/B above; 1/N for each of the N rows counted and 0 for a row that is not (a label -1, a
step past the row's length). So losses[r] is row r's own loss (0 where w[r] = 0), the loss is
sum_r w[r] losses[r], and each row's output gradient carries w[r] in place of 1/B:
    dlogits[r] = w[r] (p[r] - onehot(y_r)) ;  dout[r, k] = w[r] 2 (out[r, k] - y[r, k]) / K
"""
import math

import numpy as np
from numba import prange

from .common import (BLOCK_ROWS, Twins, matmul_nn_rows, matmul_tn_rows, njit, njit_inline,
                     njit_parallel, num_slices, row_slice, sum_rows)
from .gpu_common import bounded_kernel, cdiv, cuda, step_grid

# The softmax kernel's most threads per block: in float64 its row (one exp per entry, kept and
# scaled) takes 72 registers, more than a block of 1,024 threads may have.
LOSS_THREADS = 256


def softmax_xent_row(losses, dlogits, logits, y, w, b):
    """Row b: losses[b] = -log p[b, y_b], dlogits[b] = w[b] (p[b] - onehot(y_b)) (written, =),
    with the row's maximum subtracted before exp (one exp per entry) and the sum of exps taken
    in float64; a row that does not count (w[b] = 0, its label maybe -1) gets 0 in both.

    Written once for both twins: it takes arrays, so it is compiled twice from this source, with
    njit for the CPU twin and as a CUDA device function for the GPU twin (an njit function cannot
    take the CUDA simulator's arrays)."""
    B, K = logits.shape
    if w[b] == 0:
        losses[b] = 0
        for k in range(K):
            dlogits[b, k] = 0
        return
    mx = logits[b, 0]
    for k in range(1, K):
        mx = max(mx, logits[b, k])
    s = 0.0
    for k in range(K):
        e = math.exp(logits[b, k] - mx)
        dlogits[b, k] = e                  # exp(l_k - max), p_k once divided by s
        s += e
    losses[b] = math.log(s) - (logits[b, y[b]] - mx)
    scale = w[b] / s
    for k in range(K):
        dlogits[b, k] *= scale
    dlogits[b, y[b]] -= w[b]


def mse_row(losses, dout, out, y, w, b):
    """Row b: losses[b] = (1/K) sum_k (out[b, k] - y[b, k])^2, the row's mean, so that
    sum_b w[b] losses[b] is the mean over the counted rows' entries;
    dout[b] = w[b] 2 (out[b] - y[b]) / K (written, =; 0 for a row with w[b] = 0). In the arrays'
    dtype throughout. Written once for both twins, as softmax_xent_row."""
    B, K = out.shape
    f = losses.dtype.type                           # the dtype: no float64 arithmetic in float32
    if w[b] == 0:
        losses[b] = 0
        for k in range(K):
            dout[b, k] = 0
        return
    acc = f(0)
    for k in range(K):
        e = out[b, k] - y[b, k]
        acc += e * e
    losses[b] = acc / f(K)
    scale = f(2 * w[b] / K)                         # 2 / (B K) for a last-step readout
    for k in range(K):
        # forward was: loss = sum_b w[b] (1/K) sum_k (out[b, k] - y[b, k])^2
        # so:          dout[b, k] = w[b] 2 (out[b, k] - y[b, k]) / K
        dout[b, k] = scale * (out[b, k] - y[b, k])


softmax_xent_row_cpu = njit_inline(softmax_xent_row)
softmax_xent_row_gpu = cuda.jit(device=True)(softmax_xent_row)
mse_row_cpu = njit_inline(mse_row)
mse_row_gpu = cuda.jit(device=True)(mse_row)


# The CPU twins split their rows across threads, in blocks of BLOCK_ROWS (kernels/common.py): a
# readout at every step has T*B rows (100,352 for MNIST at B = 128), a last-step one B.

@njit_parallel
def readout_forward_cpu(logits, h, W_out, b_out):
    """logits (R, K) written (=). h (R, n), W_out (K, n), b_out (K,) read."""
    S = num_slices(h.shape[0], BLOCK_ROWS)
    for c in prange(S):
        r0, r1 = row_slice(c, S, h.shape[0])
        np.dot(h[r0:r1], W_out.T, logits[r0:r1])
        logits[r0:r1] += b_out


@njit_parallel
def softmax_xent_cpu(losses, dlogits, logits, y, w):
    """Per-row loss and the gradient of the weighted mean loss w.r.t. the logits.

    Written (=): losses (R,) = -log p[r, y_r]; dlogits (R, K) = w[r] (p - onehot(y)).
    Read: logits (R, K), y (R,) integer labels in [0, K) (any, where w[r] = 0), w (R,) float64.

    With p_rk = exp(l_rk) / sum_j exp(l_rj), loss_r = log sum_j exp(l_rj) - l_{r,y_r}, so
    d loss_r / d l_rk = p_rk - [k = y_r]; the mean weighs that by w[r] (1/B: over the batch).
    """
    S = num_slices(logits.shape[0], BLOCK_ROWS)
    for c in prange(S):
        r0, r1 = row_slice(c, S, logits.shape[0])
        for r in range(r0, r1):
            softmax_xent_row_cpu(losses, dlogits, logits, y, w, r)


@njit_parallel
def mse_cpu(losses, dout, out, y, w):
    """Per-row mean squared error and the gradient of the weighted mean w.r.t. the outputs
    (with w = 1/B, torch.nn.functional.mse_loss(out, y), reduction "mean").

    Written (=): losses (R,) = (1/K) sum_k (out[r, k] - y[r, k])^2;
    dout (R, K) = w[r] 2 (out - y) / K. Read: out (R, K), y (R, K) targets of out's dtype,
    w (R,) float64.
    """
    S = num_slices(out.shape[0], BLOCK_ROWS)
    for c in prange(S):
        r0, r1 = row_slice(c, S, out.shape[0])
        for r in range(r0, r1):
            mse_row_cpu(losses, dout, out, y, w, r)


@njit
def readout_backward_cpu(dW_out, db_out, dh, dlogits, h, W_out):
    """Written (=): dW_out (K, n), db_out (K,), dh (R, n) = dL/dh of each row.
    Read: dlogits (R, K), h (R, n), W_out (K, n)."""
    # forward was: logits = h W_out^T + b_out
    # so:          dW_out = dlogits^T h ;  db_out = sum_r dlogits ;  dh = dlogits W_out
    matmul_tn_rows(dW_out, dlogits, h)
    sum_rows(db_out, dlogits)
    matmul_nn_rows(dh, dlogits, W_out, False)


# ------------------------------------------------------------------------------------------
# GPU twins: one thread per output element, except the losses: K is small (10), so one thread
# per row does a whole softmax, or a row's squared errors. Host functions take the CPU twins'
# arguments (device arrays) and keyword-only launch options.
# ------------------------------------------------------------------------------------------

@cuda.jit(cache=True)
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


@bounded_kernel(LOSS_THREADS)
def softmax_xent_kernel(losses, dlogits, logits, y, w):
    """softmax_xent_row for row b: losses[b] = -log p[b, y_b], dlogits[b] = w[b] (p[b] - onehot)
    (written, =). One thread per row b."""
    b = cuda.grid(1)
    if b < logits.shape[0]:
        softmax_xent_row_gpu(losses, dlogits, logits, y, w, b)


@cuda.jit(cache=True)
def mse_kernel(losses, dout, out, y, w):
    """mse_row for row b: losses[b] = (1/K) sum_k (out[b, k] - y[b, k])^2,
    dout[b] = w[b] 2 (out[b] - y[b]) / K (written, =). One thread per row b."""
    b = cuda.grid(1)
    if b < out.shape[0]:
        mse_row_gpu(losses, dout, out, y, w, b)


@cuda.jit(cache=True)
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


def softmax_xent_gpu(losses, dlogits, logits, y, w, *, threads=128):
    """Twin of softmax_xent_cpu (device arrays): losses (R,), dlogits (R, K) written (=); at
    most LOSS_THREADS threads per block."""
    B = logits.shape[0]
    threads = min(threads, LOSS_THREADS)
    softmax_xent_kernel[cdiv(B, threads), threads](losses, dlogits, logits, y, w)


def mse_gpu(losses, dout, out, y, w, *, threads=128):
    """Twin of mse_cpu (device arrays): losses (R,), dout (R, K) written (=)."""
    B = out.shape[0]
    mse_kernel[cdiv(B, threads), threads](losses, dout, out, y, w)


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
