"""The classifier on top of every cell: a linear readout of h_T and a softmax cross-entropy.

    logits = h_T W_out^T + b_out                     h_T (B, n), W_out (K, n), b_out (K,)
    p      = softmax(logits)                         (B, K)
    loss   = (1/B) sum_b -log p[b, y_b]              (section 5: "the last hidden state h_T ...
                                                      into a fully-connected layer and a softmax")
Backward:
    dlogits = (p - onehot(y)) / B
    dW_out  = dlogits^T h_T ;  db_out = sum_b dlogits ;  dh_T = dlogits W_out
"""
import math

import numpy as np

from .common import njit


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
    """
    B, K = logits.shape
    for b in range(B):
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


@njit
def readout_backward_cpu(dW_out, db_out, dh, dlogits, h, W_out):
    """Written (=): dW_out (K, n), db_out (K,), dh (B, n) = dL/dh_T.
    Read: dlogits (B, K), h (B, n), W_out (K, n)."""
    # forward was: logits = h W_out^T + b_out
    np.dot(dlogits.T, h, dW_out)
    db_out[:] = dlogits.sum(axis=0)
    np.dot(dlogits, W_out, dh)
