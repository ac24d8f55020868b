"""A float32 model computes in float32: no CPU kernel does float64 arithmetic by accident.

Numba types a float literal (`1.0`) as float64 and an integer literal mixed with a float32 as
float64 too, so `(1 - z) * n_t` in a float32 kernel quietly runs in float64: half the vector
width on the CPU, and in a float32 backward pass `flush_subnormal` then sees a float64 and lets
float32 subnormals through (this happened to the GRU, whose backward pass ran 4x slower). This
test compiles each CPU kernel's float32 version afresh and reads its LLVM IR for double-precision
arithmetic. The GPU kernels get the same check on their PTX in tests/test_ptx.py.

A few kernels use float64 on purpose; FLOAT64_ON_PURPOSE names them and says why. Such an entry
must still be true (the kernel does use float64), so the list cannot go stale.
"""
import importlib
import inspect
import re
from collections import Counter

import numba
import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

from nprnn import CELLS, make_model
from nprnn.data.noise import fill_gaussian
from nprnn.kernels import common as K_common
from nprnn.core.optim import StepRecorder, make_optimizer

# the kernel modules scanned: these, and those of every registered cell's CPU twins (a new
# family's kernels file is scanned without being listed)
MODULES = list(dict.fromkeys(
    [f"nprnn.kernels.{m}" for m in ("common", "antisym", "rnn", "lstm", "gru", "readout", "optim",
                                    "noise", "layout", "stack")]
    + [twins.cpu.py_func.__module__ for cell in CELLS.values()
       for twins in (cell.forward_kernels, cell.backward_kernels)]))

FLOAT64_ON_PURPOSE = {
    "softmax_xent_cpu": "the loss and softmax of K = 10 logits per row, once per batch, in "
                        "float64 as the float64 loss accumulator",
    "sgd_momentum_cpu": "lr, momentum and the clipping scale are float64 scalars; the update of "
                        "each parameter is rounded once into its dtype",
    "adagrad_cpu": "as sgd_momentum_cpu",
    "adam_cpu": "as sgd_momentum_cpu (and the bias corrections c1, c2)",
    "sum_squares_cpu": "the squared gradient norm is summed in float64: a float32 square can "
                       "overflow",
    "mse_cpu": "each row's gradient scale 2 w[r] / K, from its float64 weight, once per row",
    "record_step_cpu": "a step's loss, correct count and gradient norm are summed into float64 "
                       "totals, once per step",
    "antisym_matrix_cpu": "A = W - W^T - gamma I with gamma a float64 scalar: n values per call",
    "shifted_matrix_cpu": "as antisym_matrix_cpu",
}
# arrays that are float64 whatever the model's dtype: the clipping factor, the running totals of
# a training step (kernels/optim.py) and the float64 accumulator of sum_squares_cpu (another
# kernel's `out` is its result, in the model's dtype: time_major_cpu's float64 version for a
# float64 model fed float32 batches is a float64 kernel)
FLOAT64_ARRAYS = {"scale", "stats", "total", "w", ("sum_squares_cpu", "out")}
# float64 arithmetic in LLVM IR: scalar or vector fadd/fsub/fmul/fdiv on double
DOUBLE_ARITHMETIC = re.compile(r"= (fadd|fsub|fmul|fdiv|frem)(?: [a-z]+)* (?:<\d+ x )?double\b")


def _run_everything_in_float32():
    """Call every CPU kernel with float32 data at tiny sizes, so that each dispatcher holds its
    float32 signatures."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 2)).astype(np.float32)
    y = np.array([0, 1, 2])
    for name in CELLS:
        model = make_model(name, 2, 4, 3, dtype="float32", seed=1)
        _, grads = model.loss_and_grad(x, y)
        for opt in (make_optimizer("sgd", model.params, 0.1),
                    make_optimizer("adagrad", model.params, 0.1),
                    make_optimizer("adam", model.params, 0.1)):
            opt.step(model.params, grads, scale=0.5)
        StepRecorder("cpu", clip=1.0).record(model.step_arrays(x, y))
        # the sequence paths: lengths, a readout at every step, two layers (kernels/stack.py)
        stacked = make_model(name, 2, 4, 3, dtype="float32", seed=1, layers=2, readout="every")
        stacked.loss_and_grad(x, np.zeros((3, 5), np.int64), lengths=[5, 2, 1])
    make_model("antisym", 2, 4, 3, dtype="float32", loss="mse").loss_and_grad(x, x[:, 0, [0, 1, 0]])
    noise = np.zeros((3, 5, 2), np.float32)
    fill_gaussian(noise, 1, np.arange(6).reshape(3, 2))
    # the row-split products, which the kernels above call from inside compiled code
    D, H = rng.standard_normal((2, 7, 3)).astype(np.float32)
    K_common.matmul_tn_rows(np.empty((3, 3), np.float32), D, H)
    K_common.matmul_nt_rows(np.empty((7, 7), np.float32), D, H)
    K_common.sum_rows(np.empty(3, np.float32), D)


def _float32_signatures():
    _run_everything_in_float32()
    found = []
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for name, disp in vars(mod).items():
            if not isinstance(disp, CPUDispatcher) or disp.py_func.__module__ != mod.__name__:
                continue
            args = list(inspect.signature(disp.py_func).parameters)
            for sig in disp.signatures:
                dtypes = {a.dtype for arg, a in zip(args, sig)
                          if isinstance(a, numba.types.Array) and arg not in FLOAT64_ARRAYS
                          and (name, arg) not in FLOAT64_ARRAYS}
                # the float32 version: float32 arrays and no float64 ones but the float64 totals
                # (time_major_cpu also has a version that converts float64 input)
                if numba.float32 in dtypes and numba.float64 not in dtypes:
                    found.append((name, disp.py_func, sig))
    return found


@pytest.fixture(scope="module")
def float32_kernels():
    return _float32_signatures()


def test_the_scan_finds_the_kernels(float32_kernels):
    names = {name for name, _, _ in float32_kernels}
    for expected in ("euler_backward_cpu", "euler_gated_forward_cpu", "rnn_backward_cpu",
                     "lstm_backward_cpu", "peephole_lstm_backward_cpu", "gru_forward_cpu",
                     "gru_backward_cpu", "matmul_tn_rows", "sum_rows", "time_major_cpu",
                     "gaussian_fill_cpu", "adagrad_cpu", "adam_cpu", "softmax_xent_cpu",
                     "record_step_cpu",
                     "mse_cpu", "cornn_forward_cpu", "cornn_backward_cpu", "lem_forward_cpu",
                     "lem_backward_cpu"):
        assert expected in names, f"no float32 call of {expected}: found {sorted(names)}"


@pytest.mark.slow
def test_float32_kernels_do_no_float64_arithmetic_unless_on_purpose(float32_kernels):
    offenders = []
    unused = set(FLOAT64_ON_PURPOSE) & {name for name, _, _ in float32_kernels}
    for name, py_func, sig in float32_kernels:
        # a fresh, uncached, serial compile of the same source: its IR is what numba made of the
        # typed code (prange runs as range; the arithmetic's types are the same)
        fresh = numba.njit(error_model="numpy")(py_func)
        fresh.compile(sig)
        ops = Counter(DOUBLE_ARITHMETIC.findall(fresh.inspect_llvm(sig)))
        if name in FLOAT64_ON_PURPOSE:
            if ops:
                unused.discard(name)
        elif ops:
            offenders.append(f"{name}: {dict(ops)}")
    assert not offenders, ("float64 arithmetic in float32 kernels (a float literal or an int "
                           "mixed with float32?):\n" + "\n".join(offenders))
    assert not unused, (f"{sorted(unused)} no longer use float64: take them out of "
                        f"FLOAT64_ON_PURPOSE")
