"""Optimizer update kernels: SGD with momentum, Adagrad, Adam, and the squared gradient norm for
clipping.

Every kernel works on one parameter tensor seen as a flat, contiguous 1-d array of N values, so a
kernel does not care whether the tensor was W (n, n) or b_h (n,). The updates, for each element:

    clipping (global norm):   s = min(1, c / ||g||)       ||g||^2 = sum over ALL tensors of g**2
                              (s = 1 when clipping is off)

    SGD with momentum:        v <- mu * v + s * g
                              p <- p - lr * v

    Adagrad (Duchi et al., 2011, diagonal form):
                              G <- G + (s * g)**2
                              p <- p - lr * s * g / (sqrt(G) + delta)

    Adam (Kingma & Ba, 2015), as torch.optim.Adam computes it (no weight decay), at step t:
                              m <- b1 * m + (1 - b1) * s * g
                              v <- b2 * v + (1 - b2) * (s * g)**2
                              p <- p - (lr / c1) * m / (sqrt(v) / c2 + eps)
                              c1 = 1 - b1**t, c2 = sqrt(1 - b2**t): the bias corrections, made
                              once per step on the host

State (v, G, m) has the parameter's dtype. The scalars (lr, momentum, delta) arrive as Python floats
and s as a float64 array of one element, so each element's update is computed in float64: the new
v or G is rounded into the state's dtype, and p's update, read from that stored value, into the
parameter's; the cost is negligible beside a training step. Both
updates leave p untouched wherever g has always been 0, so a strictly upper-triangular W (whose
gradient is 0 on and below the diagonal) stays so.

s lives in an array, not a Python float, so that on the GPU it can be computed where the gradient
is: `record_step` takes ||g||^2, the batch's losses and logits, and writes s, adding the loss, the
correct answers and ||g|| to running totals that the training loop reads only when it reports.
No step waits for the GPU. A NaN s means "skip this step": record_step writes it from the first
step whose loss or gradient is not finite, so no such step reaches the parameters.

Argument order is the project's: outputs first (updated in place), then inputs, then scalars, so
the GPU twins below (grid-stride loops over the elements) take exactly the same arguments. The
per-element math is written once and compiled for both twins.
"""
import math

import numpy as np

from .common import njit, njit_inline
from .gpu_common import WARP, cdiv, cuda, line_launch, scratch

# record_step's running totals: stats[k] for these k (float64 (STATS,)); reset by the caller
STAT_NAMES = ("steps", "count", "correct", "loss_sum", "grad_norm_sum", "first_bad", "bad_loss",
              "bad_norm")
STEPS, COUNT, CORRECT, LOSS_SUM, NORM_SUM, FIRST_BAD, BAD_LOSS, BAD_NORM = range(len(STAT_NAMES))
STATS = len(STAT_NAMES)


# ------------------------------------------------------------------------------------------
# The math, written once for the CPU and the GPU twins
# ------------------------------------------------------------------------------------------
# These functions take arrays, so each is compiled twice from the same source: for the CPU
# twins with njit (inlined, `_cpu`) and for the GPU twins as a CUDA device function (`_gpu`).
# (The cells' unit math takes scalars and is one njit function that both call; an njit function
# cannot take the CUDA simulator's arrays, which the GPU tests run on.)

@njit
def clip_factor(norm, clip):
    """s = min(1, clip / norm), and 1 when clip = 0 (clipping off). A scalar function: the CPU
    twins, the GPU twins (as a device function) and `nprnn.core.optim.clip_scale` all call it."""
    return 1.0 if clip == 0.0 or norm <= clip else clip / norm


def sgd_momentum_element(p, v, g, i, lr, momentum, s):
    """v_i = momentum v_i + s g_i ; p_i = p_i - lr v_i (in place)."""
    v[i] = momentum * v[i] + s * g[i]
    p[i] -= lr * v[i]


def adagrad_element(p, G, g, i, lr, delta, s):
    """G_i = G_i + (s g_i)**2 ; p_i = p_i - lr s g_i / (sqrt(G_i) + delta) (in place).

    G has the parameters' dtype: in float32 one |s g_i| above 1.8e19 makes G_i infinite, and p_i
    never moves again. Gradient clipping (s) is what keeps g_i that far from such values."""
    gi = s * g[i]
    G[i] += gi * gi
    p[i] -= lr * gi / (math.sqrt(G[i]) + delta)


def adam_element(p, m, v, g, i, lr, beta1, beta2, eps, c1, c2, s):
    """m_i = b1 m_i + (1 - b1) s g_i ; v_i = b2 v_i + (1 - b2) (s g_i)**2 ;
    p_i = p_i - (lr / c1) m_i / (sqrt(v_i) / c2 + eps) (in place)."""
    gi = s * g[i]
    m[i] = beta1 * m[i] + (1.0 - beta1) * gi
    v[i] = beta2 * v[i] + (1.0 - beta2) * gi * gi
    p[i] -= (lr / c1) * m[i] / (math.sqrt(v[i]) / c2 + eps)


def record_step(stats, scale, losses, logits, y, w, total, clip):
    """After one step's forward and backward pass: add it to the running totals and write the
    clipping factor.

    Updated: stats (STATS,) float64: STEPS += 1; unless the step is bad, COUNT += the rows
             counted (w[r] != 0), CORRECT += those whose largest logit is the label's (the first
             largest, as numpy's argmax; none for a regression's y (R, K)), LOSS_SUM += sum of
             losses, NORM_SUM += ||g||. The first step whose loss sum or ||g|| is not finite sets
             FIRST_BAD = its STEPS count, BAD_LOSS (the mean loss) and BAD_NORM.
    Written: scale (1,) float64 = min(1, clip / ||g||) (1 for clip = 0), or NaN from the first bad
             step on (the updates then leave the parameters alone).
    Read:    losses (R,), logits (R, K), y (R,) int or (R, K) targets, w (R,) the rows' weights
             (kernels/readout.py), total (1,) = ||g||^2, clip >= 0.
    """
    R, K = logits.shape
    f64 = stats.dtype.type               # float64 whatever the losses' dtype (also in NumPy 2's
    loss_sum = f64(0)                    # rules, which the CUDA simulator follows)
    correct = 0
    B = 0                                # the rows counted
    for b in range(R):
        if w[b] == 0:
            continue
        B += 1
        loss_sum += f64(losses[b])
        if y.ndim == 1:
            best = 0
            for k in range(1, K):
                if logits[b, k] > logits[b, best]:
                    best = k
            if best == y[b]:
                correct += 1
    norm = math.sqrt(total[0])
    stats[STEPS] += 1
    if stats[FIRST_BAD] == 0 and not (math.isfinite(loss_sum) and math.isfinite(norm)):
        stats[FIRST_BAD] = stats[STEPS]
        stats[BAD_LOSS] = loss_sum / max(B, 1)
        stats[BAD_NORM] = norm
    if stats[FIRST_BAD] != 0:
        scale[0] = math.nan
        return
    stats[COUNT] += B
    stats[CORRECT] += correct
    stats[LOSS_SUM] += loss_sum
    stats[NORM_SUM] += norm
    scale[0] = clip_factor(norm, clip)


sgd_momentum_element_cpu = njit_inline(sgd_momentum_element)
adagrad_element_cpu = njit_inline(adagrad_element)
adam_element_cpu = njit_inline(adam_element)
record_step_cpu_inline = njit_inline(record_step)
sgd_momentum_element_gpu = cuda.jit(device=True)(sgd_momentum_element)
adagrad_element_gpu = cuda.jit(device=True)(adagrad_element)
adam_element_gpu = cuda.jit(device=True)(adam_element)
record_step_gpu_device = cuda.jit(device=True)(record_step)


# ------------------------------------------------------------------------------------------
# CPU twins
# ------------------------------------------------------------------------------------------

@njit
def sum_squares_cpu(out, g):
    """out[0] += sum_i g_i**2, accumulated in out's dtype (float64). g (N,) read; out (1,)."""
    acc = 0.0
    for i in range(g.shape[0]):
        gi = np.float64(g[i])             # square in float64: a float32 square can overflow
        acc += gi * gi
    out[0] += acc


@njit
def sgd_momentum_cpu(p, v, g, lr, momentum, scale):
    """One step of SGD with momentum, in place (nothing when scale[0] is NaN).

    Updated (in place): p (N,) parameters, v (N,) velocity.
    Read: g (N,) gradient; scale (1,) float64, the clipping factor s.
        v_i = momentum * v_i + s * g_i
        p_i = p_i - lr * v_i
    """
    s = scale[0]
    if math.isnan(s):
        return
    for i in range(p.shape[0]):
        sgd_momentum_element_cpu(p, v, g, i, lr, momentum, s)


@njit
def adagrad_cpu(p, G, g, lr, delta, scale):
    """One step of Adagrad, in place (nothing when scale[0] is NaN).

    Updated (in place): p (N,) parameters, G (N,) sum of squared (clipped) gradients.
    Read: g (N,) gradient; scale (1,) float64, the clipping factor s.
        G_i = G_i + (s * g_i)**2
        p_i = p_i - lr * s * g_i / (sqrt(G_i) + delta)
    """
    s = scale[0]
    if math.isnan(s):
        return
    for i in range(p.shape[0]):
        adagrad_element_cpu(p, G, g, i, lr, delta, s)


@njit
def adam_cpu(p, m, v, g, lr, beta1, beta2, eps, c1, c2, scale):
    """One step of Adam, in place (nothing when scale[0] is NaN).

    Updated (in place): p (N,) parameters, m (N,) and v (N,) the moving averages of the (clipped)
    gradient and of its square.
    Read: g (N,) gradient; scale (1,) float64, the clipping factor s; c1, c2 this step's bias
    corrections (module docstring).
    """
    s = scale[0]
    if math.isnan(s):
        return
    for i in range(p.shape[0]):
        adam_element_cpu(p, m, v, g, i, lr, beta1, beta2, eps, c1, c2, s)


@njit
def record_step_cpu(stats, scale, losses, logits, y, w, total, clip):
    """See record_step: the step's totals into stats, its clipping factor into scale."""
    record_step_cpu_inline(stats, scale, losses, logits, y, w, total, clip)


# ------------------------------------------------------------------------------------------
# GPU twins: grid-stride loops for the updates; the norm as a two-pass reduction
# ------------------------------------------------------------------------------------------
# Host functions take the CPU twins' arguments (device arrays; out is a float64 (1,) device
# array) and keyword-only launch options. The reduction uses a fixed number of blocks, so the
# sum is taken in the same order on every GPU and every run: training on the GPU is repeatable.

SUM_BLOCKS = 64


@cuda.jit(cache=True)
def sum_squares_block_kernel(block_sums, g):
    """block_sums[k] = sum of g_i**2 (in float64) over the elements i that block k visits:
    i = k * blockDim + tid, then strides of gridDim * blockDim. Written (=): block_sums (gridDim,).
    Each thread sums its elements, then the block adds its threads' sums in a tree in shared
    memory (blockDim must be a power of two)."""
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    sums = cuda.shared.array(0, dtype=block_sums.dtype)
    acc = block_sums.dtype.type(0)
    for i in range(cuda.grid(1), g.shape[0], cuda.gridDim.x * nthreads):
        gi = block_sums.dtype.type(g[i])     # square in float64: a float32 square can overflow
        acc += gi * gi
    sums[tid] = acc
    cuda.syncthreads()
    half = nthreads // 2
    while half > 0:
        if tid < half:
            sums[tid] += sums[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        block_sums[cuda.blockIdx.x] = sums[0]


@cuda.jit(cache=True)
def sum_block_sums_kernel(out, block_sums):
    """out[0] += sum_k block_sums[k], in order, by one thread (updated, +=)."""
    if cuda.grid(1) == 0:
        acc = out.dtype.type(0)
        for k in range(block_sums.shape[0]):
            acc += block_sums[k]
        out[0] += acc


def sum_squares_gpu(out, g, *, threads=256):
    """Twin of sum_squares_cpu: out[0] += sum_i g_i**2. out (1,) float64, g (N,) (device)."""
    if threads & (threads - 1):
        raise ValueError(f"threads must be a power of two, got {threads}")
    threads = min(threads, max(WARP, 1 << (g.shape[0] - 1).bit_length()))   # a small g: fewer
    blocks = max(1, min(SUM_BLOCKS, cdiv(g.shape[0], threads)))
    block_sums = scratch("sum_squares", (blocks,), out.dtype)
    sum_squares_block_kernel[blocks, threads, 0, threads * out.dtype.itemsize](block_sums, g)
    sum_block_sums_kernel[1, 1](out, block_sums)


@cuda.jit(cache=True)
def sgd_momentum_kernel(p, v, g, lr, momentum, scale):
    """sgd_momentum_element for every element i (nothing when scale[0] is NaN), in a
    grid-stride loop over a 1-d grid."""
    s = scale[0]
    if not math.isnan(s):
        for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
            sgd_momentum_element_gpu(p, v, g, i, lr, momentum, s)


@cuda.jit(cache=True)
def adagrad_kernel(p, G, g, lr, delta, scale):
    """adagrad_element for every element i (nothing when scale[0] is NaN), in a grid-stride
    loop over a 1-d grid."""
    s = scale[0]
    if not math.isnan(s):
        for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
            adagrad_element_gpu(p, G, g, i, lr, delta, s)


@cuda.jit(cache=True)
def adam_kernel(p, m, v, g, lr, beta1, beta2, eps, c1, c2, scale):
    """adam_element for every element i (nothing when scale[0] is NaN), in a grid-stride loop
    over a 1-d grid."""
    s = scale[0]
    if not math.isnan(s):
        for i in range(cuda.grid(1), p.shape[0], cuda.gridsize(1)):
            adam_element_gpu(p, m, v, g, i, lr, beta1, beta2, eps, c1, c2, s)


@cuda.jit(cache=True)
def record_step_kernel(stats, scale, losses, logits, y, w, total, clip):
    """record_step by one thread (R K comparisons: microseconds, and a fixed order)."""
    if cuda.grid(1) == 0:
        record_step_gpu_device(stats, scale, losses, logits, y, w, total, clip)


def sgd_momentum_gpu(p, v, g, lr, momentum, scale, *, threads=256):
    """Twin of sgd_momentum_cpu (device arrays): p, v (N,) updated in place."""
    sgd_momentum_kernel[line_launch(p.shape[0], threads)](p, v, g, lr, momentum, scale)


def adagrad_gpu(p, G, g, lr, delta, scale, *, threads=256):
    """Twin of adagrad_cpu (device arrays): p, G (N,) updated in place."""
    adagrad_kernel[line_launch(p.shape[0], threads)](p, G, g, lr, delta, scale)


def adam_gpu(p, m, v, g, lr, beta1, beta2, eps, c1, c2, scale, *, threads=256):
    """Twin of adam_cpu (device arrays): p, m, v (N,) updated in place."""
    adam_kernel[line_launch(p.shape[0], threads)](p, m, v, g, lr, beta1, beta2, eps, c1, c2,
                                                  scale)


def record_step_gpu(stats, scale, losses, logits, y, w, total, clip):
    """Twin of record_step_cpu (device arrays; clip a Python float)."""
    record_step_kernel[1, 1](stats, scale, losses, logits, y, w, total, clip)
