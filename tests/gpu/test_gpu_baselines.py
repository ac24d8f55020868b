"""GPU twins of the baselines (nprnn/kernels/rnn.py, lstm.py, gru.py, and their fast versions in
nprnn/kernels/fast/) against their CPU twins.

As in test_gpu_euler.py: the CPU twin runs first, the GPU twin runs on the same inputs, and every
output is compared; the backward tests start from the CPU's forward results.
"""
import numpy as np
import pytest

from gpu_testing import (B, DTYPES, M, N, ROWS, STEP_BLOCK, T, THREADS, TILE, assert_close, dev,
                         empty_like, rand, requires_cuda)
from test_gpu_euler import sequence

from nprnn.kernels import gru, lstm, rnn
from nprnn.kernels.fast import gru as fast_gru
from nprnn.kernels.fast import lstm as fast_lstm
from nprnn.kernels.fast import rnn as fast_rnn

pytestmark = requires_cuda

# cell -> (kernel module, function prefix, number of gates G, extra forward state arrays)
CELLS = {"rnn": (rnn, "rnn", 1), "lstm": (lstm, "lstm", 4),
         "peephole-lstm": (lstm, "peephole_lstm", 4), "gru": (gru, "gru", 3)}


def options(version, backward, rows=ROWS, lanes=2):
    opts = {"step": dict(block=STEP_BLOCK), "split": dict(rows=rows, lanes=lanes)}.get(
        version, dict(rows=rows, threads=THREADS))
    return dict(opts, tile=TILE) if backward else opts


# teaching module -> its fast sibling, which holds versions 2 (and 3, for rnn and gru)
FAST = {rnn: fast_rnn, lstm: fast_lstm, gru: fast_gru}


def gpu_function(module, prefix, direction, version):
    if version != "step":                            # versions 2 and 3: kernels/fast/
        module = FAST[module]
    return getattr(module, f"{prefix}_{direction}_gpu"
                           + {"step": "", "split": "_split"}.get(version, "_persistent"))


def problem(cell, dtype, seed=0, ragged=False):
    """Inputs; the forward state arrays of the cell (hs, and cs/gates/hn) after the CPU twin's
    forward pass; the CPU twin's backward outputs. Returns dicts of NumPy arrays. ragged: rows
    of their own lengths and a gradient at every step (test_gpu_euler.sequence)."""
    module, prefix, G = CELLS[cell]
    rng = np.random.default_rng(seed)
    p = dict(x=rand(rng, (T, B, M), dtype), W_ih=rand(rng, (G * N, M), dtype, 0.7),
             W_hh=rand(rng, (G * N, N), dtype, 0.5), b_ih=rand(rng, (G * N,), dtype, 0.2),
             b_hh=rand(rng, (G * N,), dtype, 0.2), dh_T=rand(rng, (B, N), dtype))
    p["lengths"], p["dhs"] = sequence(rng, dtype, T, ragged)
    if cell == "peephole-lstm":
        p.update(w_ci=rand(rng, (N,), dtype, 0.5), w_cf=rand(rng, (N,), dtype, 0.5),
                 w_co=rand(rng, (N,), dtype, 0.5))
    hs = np.zeros((T + 1, B, N), dtype)
    hs[0] = rand(rng, (B, N), dtype, 0.5)
    fw = dict(hs=hs)
    if cell in ("lstm", "peephole-lstm"):
        fw["cs"] = np.zeros((T + 1, B, N), dtype)
        fw["cs"][0] = rand(rng, (B, N), dtype, 0.5)
        fw["gates"] = np.empty((T, B, 4 * N), dtype)
        p["dc_T"] = rand(rng, (B, N), dtype)          # dL/dc_T, which the LSTMs' BPTT takes
    if cell == "gru":
        fw.update(gates=np.empty((T, B, 3 * N), dtype), hn=np.empty((T, B, N), dtype))
    getattr(module, f"{prefix}_forward_cpu")(*forward_args(cell, fw, p), p["lengths"])
    bw = dict(dW_ih=np.empty_like(p["W_ih"]), dW_hh=np.empty_like(p["W_hh"]),
              db_ih=np.empty_like(p["b_ih"]), db_hh=np.empty_like(p["b_hh"]),
              dh0=np.empty((B, N), dtype))
    if cell == "gru":
        bw.update(dgi=np.empty((T, B, 3 * N), dtype), dgh=np.empty((T, B, 3 * N), dtype))
    else:
        bw["da"] = np.empty((T, B, G * N), dtype)
    if cell == "peephole-lstm":
        bw.update(dw_ci=np.empty(N, dtype), dw_cf=np.empty(N, dtype), dw_co=np.empty(N, dtype))
    if "dc_T" in p:
        bw["dc"] = p["dc_T"].copy()                  # dL/dc_T in, dL/dc_0 out
    getattr(module, f"{prefix}_backward_cpu")(*backward_args(cell, bw, fw, p), p["dhs"],
                                              p["lengths"])
    return p, fw, bw


def forward_args(cell, fw, p):
    """The forward twins' argument list (outputs first, as the kernels take them)."""
    weights = (p["W_ih"], p["W_hh"], p["b_ih"], p["b_hh"])
    if cell == "rnn":
        return (fw["hs"], p["x"]) + weights
    if cell == "gru":
        return (fw["hs"], fw["gates"], fw["hn"], p["x"]) + weights
    peep = (p["w_ci"], p["w_cf"], p["w_co"]) if cell == "peephole-lstm" else ()
    return (fw["hs"], fw["cs"], fw["gates"], p["x"]) + weights + peep


def backward_args(cell, bw, fw, p):
    """The backward twins' argument list."""
    dW = (bw["dW_ih"], bw["dW_hh"], bw["db_ih"], bw["db_hh"])
    if cell == "rnn":
        return dW + (bw["dh0"], bw["da"], p["dh_T"], fw["hs"], p["x"], p["W_hh"])
    if cell == "gru":
        return dW + (bw["dh0"], bw["dgi"], bw["dgh"], p["dh_T"], fw["hs"], fw["gates"],
                     fw["hn"], p["x"], p["W_hh"])
    state = (fw["hs"], fw["cs"], fw["gates"], p["x"], p["W_hh"])
    if cell == "lstm":
        return dW + (bw["dh0"], bw["dc"], bw["da"], p["dh_T"]) + state
    return (dW + (bw["dw_ci"], bw["dw_cf"], bw["dw_co"], bw["dh0"], bw["dc"], bw["da"],
                  p["dh_T"])
            + state + (p["w_ci"], p["w_cf"], p["w_co"]))


CASES = [(cell, dtype, version) for cell in CELLS for dtype in DTYPES
         for version in ("step", "persistent")] + [(cell, dtype, "split") for cell in ("rnn", "gru")
                                                   for dtype in DTYPES]


@pytest.mark.parametrize("cell, dtype, version", CASES)
def test_baseline_forward_and_backward_match_cpu(cell, dtype, version, rows=ROWS, lanes=2,
                                                 ragged=False):
    module, prefix, _ = CELLS[cell]
    p, fw, bw = problem(cell, dtype, ragged=ragged)
    d = {k: dev(v) for k, v in p.items()}
    # the sequence's arguments, which version 1 takes last and the fast versions do not take
    fw_seq = (d["lengths"],) if version == "step" else ()
    bw_seq = (d["dhs"], d["lengths"]) if version == "step" else ()
    # forward: the initial states (hs[0], cs[0]) given, everything else written
    fw_gpu = {}
    for k, v in fw.items():
        start = np.zeros_like(v)
        if k in ("hs", "cs"):
            start[0] = v[0]
        fw_gpu[k] = dev(start)
    gpu_function(module, prefix, "forward", version)(*forward_args(cell, fw_gpu, d), *fw_seq,
                                                     **options(version, False, rows, lanes))
    for k, want in fw.items():
        assert_close(fw_gpu[k], want, dtype, k)
    # backward, from the CPU's forward results
    fw_dev = {k: dev(v) for k, v in fw.items()}
    bw_gpu = {k: empty_like(v) for k, v in bw.items()}
    if "dc" in bw:
        bw_gpu["dc"] = dev(p["dc_T"])
    gpu_function(module, prefix, "backward", version)(*backward_args(cell, bw_gpu, fw_dev, d),
                                                      *bw_seq,
                                                      **options(version, True, rows, lanes))
    for k, want in bw.items():
        assert_close(bw_gpu[k], want, dtype, k)


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_step_kernels_take_lengths_and_gradients_at_every_step(cell, dtype):
    """Rows of lengths T, 1 and in between, and dL/dh_t entering at every step: version 1 as the
    CPU twin (the persistent and split kernels take neither; a model runs version 1 then)."""
    test_baseline_forward_and_backward_match_cpu(cell, dtype, "step", ragged=True)


@pytest.mark.parametrize("lanes, rows", [(4, 1), (8, 3)])
def test_rnn_split_kernels_at_other_lanes_and_rows(lanes, rows):
    """As test_gpu_euler.py's: 4 lanes, 2 values of W_hh each; 8 lanes, one value each, two
    warps, a block with one row of 3."""
    test_baseline_forward_and_backward_match_cpu("rnn", "float64", "split", rows=rows,
                                                 lanes=lanes)


@pytest.mark.parametrize("most_n_held, lanes, rows", [(None, 4, 1), (0, 2, 1), (1, 4, 3)])
def test_gru_split_kernels_with_the_matrix_partly_in_shared_memory(most_n_held, lanes, rows,
                                                                   monkeypatch):
    """The split GRU keeps gates r's and z's values in registers, and of gate n's the first
    n_held, the rest in shared memory (fast/gru.py). At this small n all fit registers, so the
    plan is capped: none of gate n's 3 values per lane in registers at 2 lanes, 1 of 2 at 4
    lanes with a block of 3 rows of which one exists; uncapped at 4 lanes, both."""
    plan = fast_gru.gru_split_plan
    monkeypatch.setattr(fast_gru, "gru_split_plan",
                        lambda *a, **k: plan(*a, **dict(k, most_n_held=most_n_held)))
    cap = -(-N // lanes)
    assert fast_gru.gru_split_plan(N, lanes, "float64").n_held == (
        cap if most_n_held is None else most_n_held)
    test_baseline_forward_and_backward_match_cpu("gru", "float64", "split", rows=rows,
                                                 lanes=lanes)


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("rows", [1, 3])
def test_persistent_kernels_at_other_rows_per_block(cell, rows):
    """rows = 1 is what `backends.LAUNCH` uses; 3 rows per block leave a block with one row of 3."""
    test_baseline_forward_and_backward_match_cpu(cell, "float64", "persistent", rows=rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 5])
def test_peephole_gradients_over_slices_of_rows(dtype, splits):
    """The peephole gradients summed over S slices of the T*B rows (the cell tests are too small
    for more than one slice; with S = 5 and 12 rows the last slice is empty) equal the CPU sums."""
    rng = np.random.default_rng(1)
    da, cs = rand(rng, (T, B, 4 * N), dtype), rand(rng, (T + 1, B, N), dtype)
    want = [np.einsum("tbj,tbj->j", da[:, :, g * N:(g + 1) * N].astype(np.float64),
                      cs[c:T + c].astype(np.float64)) for g, c in ((0, 0), (1, 0), (3, 1))]
    got = [empty_like(np.empty(N, dtype)) for _ in range(3)]
    lstm.peephole_grads_gpu(*got, dev(da), dev(cs), threads=THREADS, splits=splits)
    for name, g, w in zip(("dw_ci", "dw_cf", "dw_co"), got, want):
        assert_close(g, w.astype(dtype), dtype, name)
