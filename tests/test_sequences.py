"""Sequences as researchers use them (issue 52): each row's own length, a readout at every step,
stacked layers, on every registered cell, in the chain of witnesses:

    finite differences -> the model's gradients (float64 CPU kernels), every path
    the float64 reference by definition (nprnn/core/reference.py, "Sequences") -> each cell's
        CPU kernels with lengths and a gradient entering at every step
    the model's API: names of stacked parameters, outputs past a row's length, what the loss
        counts, and one-line refusals of what it cannot take
The GPU twins are held to the CPU ones in tests/gpu (test_gpu_euler.py, test_gpu_baselines.py,
test_gpu_model.py).
"""
import functools

import numpy as np
import pytest

import nprnn
from nprnn.core import reference
from nprnn.core.cells import CELLS, variants
from nprnn.core.gradcheck import numerical_gradient, relative_error
from nprnn.core.model import count_params

B, T, M, N, K = 3, 5, 2, 4, 3
VARIANTS = variants()
# large enough steps that every parameter's gradient stands far above the finite differences'
# rounding (at eps = 0.01 a stacked layer's gradients are ~eps^2 of the loss)
HYPER = {"eps": 0.5, "gamma": 0.1, "dt": 0.2}


def model_for(name, options, dtype="float64", **kw):
    cell = CELLS[name]
    hyper = {k: v for k, v in HYPER.items() if k in cell.hyper}
    return nprnn.make_model(name, M, N, K, dtype=dtype, seed=1, sigma_w=2.0, **hyper,
                            **options, **kw)


def targets(rng, readout, loss):
    if readout == "last":
        return rng.integers(0, K, B) if loss == "xent" else rng.standard_normal((B, K))
    if loss == "xent":
        return rng.integers(-1, K, (B, T))          # -1: no loss at that step
    return rng.standard_normal((B, T, K))


def check_finite_differences(model, x, y, lengths):
    loss, grads = model.loss_and_grad(x, y, lengths=lengths)
    assert np.isfinite(loss) and set(grads) == set(model.params)
    for key, p in model.params.items():
        base = key.rsplit("_l", 1)[0] if model.layers > 1 else key
        mask = None if key in ("W_out", "b_out") else model.cell.grad_mask(base, N)
        num = numerical_gradient(lambda: model.loss_and_grad(x, y, lengths=lengths)[0], p,
                                 mask=mask)
        assert np.abs(num).max() > 1e-8, f"{key}: the check would see nothing"
        err = relative_error(grads[key], num)
        assert err < 1e-6, f"{key}: relative error {err:.2e}"


# every cell: a readout at every step with ragged lengths (1, T and between), and two layers
# read from each row's last step; lengths of 1, T and between in each
PATHS = {"every-xent-ragged": dict(readout="every", loss="xent", layers=1),
         "last-mse-2-layers": dict(readout="last", loss="mse", layers=2)}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("label, name, options", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_gradients_match_finite_differences(label, name, options, path):
    rng = np.random.default_rng(0)
    settings = PATHS[path]
    model = model_for(name, options, layers=settings["layers"], readout=settings["readout"],
                      loss=settings["loss"])
    x = rng.standard_normal((B, T, M))
    check_finite_differences(model, x, targets(rng, settings["readout"], settings["loss"]),
                             lengths=[T, 1, 3])


@pytest.mark.parametrize("layers, readout, loss, lengths", [
    (3, "last", "xent", [2, T, 1]),
    (3, "every", "mse", None),
    (2, "every", "mse", [4, 1, T]),
    (1, "last", "xent", [1, 2, 1]),
])
@pytest.mark.parametrize("name", ["antisym", "lstm"])
def test_more_paths_match_finite_differences(name, layers, readout, loss, lengths):
    rng = np.random.default_rng(1)
    model = model_for(name, {}, layers=layers, readout=readout, loss=loss)
    check_finite_differences(model, rng.standard_normal((B, T, M)),
                             targets(rng, readout, loss), lengths)


@pytest.mark.parametrize("label, name, options", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_cpu_kernels_match_the_reference_by_definition(label, name, options):
    """One layer's kernels with lengths (T, 1, between) and dL/dh_t at every step (and dL/dh_T)
    against reference.sequence_backward, which knows neither: it cuts each row at each step."""
    model = model_for(name, options)
    cell, hyper = model.cell, model.hyper
    p = model.cell_params()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, T, M))
    lengths = np.array([T, 1, 3])
    dhs, dh_T = rng.standard_normal((B, T, N)), rng.standard_normal((B, N))
    forward = functools.partial(cell.reference_forward, **hyper)
    backward = functools.partial(cell.reference_backward, **hyper)
    xt = np.ascontiguousarray(x.transpose(1, 0, 2))
    _, cache = cell.forward(p, xt, lengths=lengths, **hyper)
    want_hs = reference.stacked_forward(forward, [p], x, lengths)
    np.testing.assert_allclose(cache["hs"][1:].transpose(1, 0, 2), want_hs, rtol=1e-12,
                               atol=1e-14)
    grads, _ = cell.backward(p, cache, dh_T, dhs=np.ascontiguousarray(dhs.transpose(1, 0, 2)),
                             **hyper)
    want = reference.sequence_backward(forward, backward, p, x, dhs, dh_T, lengths)
    for k in p:
        assert relative_error(grads[k], want[k]) < 1e-12, k


@pytest.mark.parametrize("name", ["antisym-gated", "gru", "peephole-lstm"])
def test_stacked_outputs_match_the_reference(name):
    """Three layers, each reading the hidden sequence of the one below, rows cut at their
    lengths: the model's outputs at every step are the reference's through W_out."""
    model = model_for(name, {}, layers=3, readout="every")
    rng = np.random.default_rng(3)
    x, lengths = rng.standard_normal((B, T, M)), np.array([2, T, 1])
    ps = [model.cell_params(k) for k in range(3)]
    H = reference.stacked_forward(functools.partial(model.cell.reference_forward,
                                                    **model.hyper), ps, x, lengths)
    want = H @ model.params["W_out"].T + model.params["b_out"]
    want[np.arange(T)[None, :] >= lengths[:, None]] = 0
    np.testing.assert_allclose(model.forward(x, lengths=lengths), want, rtol=1e-12, atol=1e-14)


def test_a_row_with_its_length_is_the_row_cut_there():
    """lengths = the definition: the row's outputs as if it ended there, its padding unread."""
    model = model_for("antisym", {})
    rng = np.random.default_rng(4)
    x = rng.standard_normal((B, T, M))
    out = model.forward(x, lengths=[T, 2, 4])
    for b, L in enumerate([T, 2, 4]):
        np.testing.assert_allclose(out[b], model.forward(x[b:b + 1, :L])[0], rtol=1e-13)
    x[1, 2:] = 1e3                                   # past row 1's length: never read
    np.testing.assert_array_equal(model.forward(x, lengths=[T, 2, 4])[1], out[1])


def test_lengths_all_T_are_no_lengths():
    model = model_for("gru", {})
    x = np.random.default_rng(5).standard_normal((B, T, M))
    np.testing.assert_array_equal(model.forward(x, lengths=[T] * B), model.forward(x))


def test_every_step_loss_is_the_mean_over_the_entries_counted():
    """xent: labels -1 and steps past a row's length do not count (torch's ignore_index=-1 over
    pad_packed_sequence's padding); mse: steps past a length do not count."""
    rng = np.random.default_rng(6)
    x, lengths = rng.standard_normal((B, T, M)), np.array([T, 2, 3])
    model = model_for("lstm", {}, readout="every")
    y = rng.integers(-1, K, (B, T))
    out = model.forward(x, lengths=lengths)
    assert not out[1, 2:].any() and not out[2, 3:].any()
    counted = (y >= 0) & (np.arange(T)[None, :] < lengths[:, None])
    z = out - out.max(axis=2, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=2, keepdims=True))
    want = -logp[counted, y[counted]].mean()
    assert model.loss_and_grad(x, y, lengths=lengths)[0] == pytest.approx(want, rel=1e-12)
    model = model_for("lstm", {}, readout="every", loss="mse")
    y = rng.standard_normal((B, T, K))
    out = model.forward(x, lengths=lengths)
    inside = np.arange(T)[None, :] < lengths[:, None]
    want = ((out - y)[inside] ** 2).mean()
    assert model.loss_and_grad(x, y, lengths=lengths)[0] == pytest.approx(want, rel=1e-12)


def test_stacked_parameters_take_the_layer_suffix_and_are_counted():
    one = model_for("lstm", {})
    assert set(one.params) == {"weight_ih", "weight_hh", "bias_ih", "bias_hh", "W_out", "b_out"}
    two = model_for("lstm", {}, layers=2)
    assert set(two.params) == {f"{k}_l{i}" for k in ("weight_ih", "weight_hh", "bias_ih",
                                                      "bias_hh") for i in (0, 1)} | {"W_out",
                                                                                    "b_out"}
    assert two.params["weight_ih_l0"].shape == (4 * N, M)
    assert two.params["weight_ih_l1"].shape == (4 * N, N)          # reads layer 0's states
    for name in ("antisym", "lstm"):
        model = model_for(name, {}, layers=3)
        assert model.num_params() == count_params(model.cell, M, N, K, 3) == sum(
            model.cell.count(M if k == 0 else N, N) for k in range(3)) + K * N + K
    assert model_for("antisym", {}, layers=2).config["layers"] == 2
    assert "layers" not in one.config and "readout" not in one.config


def test_one_layer_keeps_the_model_of_before():
    """layers=1, readout "last": the same parameters from the same seed as before the sequence
    API (the readout drawn after the cell), so runs and checkpoints on disk keep their models."""
    model = model_for("antisym", {})
    rng = np.random.default_rng(1)
    p = CELLS["antisym"].init(rng, M, N, np.dtype("float64"), sigma_w=2.0)
    np.testing.assert_array_equal(model.params["W"], p["W"])
    W_out = rng.standard_normal((K, N)) * np.sqrt(1.0 / N)
    np.testing.assert_array_equal(model.params["W_out"], W_out)


@pytest.mark.parametrize("call, match", [
    (lambda m, x: m.forward(x, lengths=[T, 0, 1]), r"lengths\[1\] = 0 is out of range: .*\[1, 5\]"),
    (lambda m, x: m.forward(x, lengths=[T, 6, 1]), r"lengths\[1\] = 6 is out of range"),
    (lambda m, x: m.forward(x, lengths=[T, 1]), r"lengths must be integers of shape \(B,\) = "
                                                r"\(3,\)"),
    (lambda m, x: m.forward(x, lengths=[1.0, 2.0, 3.0]), "lengths must be integers"),
    (lambda m, x: m.loss_and_grad(x, np.zeros(B, np.int64)), r"shape \(B, T\) = \(3, 5\)"),
    (lambda m, x: m.loss_and_grad(x, np.full((B, T), K)), r"label y\[0, 0\] = 3 out of range"),
    (lambda m, x: m.loss_and_grad(x, np.full((B, T), -1)), "no step of y counts"),
])
def test_bad_sequences_are_refused_in_one_line(call, match):
    model = model_for("antisym", {}, readout="every")
    with pytest.raises(ValueError, match=match):
        call(model, np.zeros((B, T, M)))


@pytest.mark.parametrize("option, match", [
    (dict(readout="each"), r"readout must be one of \('last', 'every'\), got 'each'"),
    (dict(layers=0), "layers must be an integer >= 1, got 0"),
    (dict(layers=1.5), "layers must be an integer >= 1"),
])
def test_bad_model_options_are_refused(option, match):
    with pytest.raises(ValueError, match=match):
        nprnn.make_model("antisym", M, N, K, **option)


def test_float32_stacked_every_step_model_agrees_with_float64():
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((B, T, M)), rng.integers(-1, K, (B, T))
    got = [model_for("gru", {}, dtype=dtype, layers=2, readout="every").loss_and_grad(
        x, y, lengths=[T, 2, 1]) for dtype in ("float32", "float64")]
    assert got[0][0] == pytest.approx(got[1][0], rel=1e-5)
    for k in got[1][1]:
        np.testing.assert_allclose(got[0][1][k], got[1][1][k], rtol=2e-4, atol=2e-6)
