"""Every cell in the registry, checked link by link:

    finite differences (float64) -> reference.py (float64 NumPy) -> @njit CPU kernels

The GPU link (CPU kernels -> @cuda.jit kernels) is in test_cuda.py. Tests are parametrised over
`nprnn.CELLS`, so a cell that is registered is a cell that is checked, in each form of W it
takes (`cells.variants()`: "antisym[w_form=full]" beside "antisym").
"""
import re

import numpy as np
import pytest

import nprnn
from nprnn.core import reference
from nprnn.core.cells import variants
from nprnn.core.gradcheck import check_model_gradients, numerical_gradient, relative_error
from nprnn.core.model import LOSSES                  # "xent", "mse": the readout's losses

CELL_NAMES = [label for label, _, _ in variants()]   # "antisym", ..., "antisym[w_form=full]"
B, T, M, N, K = 3, 7, 3, 5, 4          # tiny, but several steps of full BPTT
# hyperparameters large enough that every gradient stands far above the finite differences'
# rounding (each cell takes those it has; the others keep their defaults)
HYPER = {"eps": 0.5, "gamma": 0.1, "dt": 0.2}


def variant(label):
    """(cell name, make_model options) of a label: a registered cell's name as it is (a cell
    registered by a test too), or another form's ("antisym[w_form=full]")."""
    if label in nprnn.CELLS:
        return label, {}
    return next((name, options) for lab, name, options in variants() if lab == label)


def make(label, *args, **kw):
    """make_model for a variant's label: its cell's name and its options."""
    name, options = variant(label)
    return nprnn.make_model(name, *args, **options, **kw)


def random_model(label, dtype="float64", seed=0, loss="xent"):
    """A model whose parameters are all non-zero (biases and peepholes too), so that every
    gradient path is exercised; the strict upper triangle of an antisymmetric W is respected."""
    hyper = nprnn.CELLS[variant(label)[0]].hyper
    model = make(label, M, N, K, dtype=dtype, seed=seed, sigma_w=2.0, loss=loss,
                 **{k: v for k, v in HYPER.items() if k in hyper})
    rng = np.random.default_rng(seed + 100)
    for key, value in model.params.items():
        noise = 0.3 * rng.standard_normal(value.shape)
        mask = model.cell.grad_mask(key, N)
        value += (noise if mask is None else noise * mask).astype(value.dtype)
    return model


def batch(seed=1, dtype=np.float64, loss="xent"):
    """x (B, T, M) and y: labels (B,) in [0, K) for "xent", float64 targets (B, K) for "mse"."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, M)).astype(dtype)
    return x, rng.integers(0, K, size=B) if loss == "xent" else rng.standard_normal((B, K))


# the float64 oracle's readout and loss of each loss: (readout_loss, readout_backward)
REFERENCE_READOUT = {"xent": (reference.readout_loss, reference.readout_backward),
                     "mse": (reference.readout_mse_loss, reference.readout_mse_backward)}


def reference_loss_and_grads(model, x, y, return_logits=False):
    """The whole model through the float64 oracle: cell, readout, loss (the model's), and BPTT."""
    p = model.cell_params()
    h_T, cache = model.cell.reference_forward(p, x, **model.hyper)
    readout_loss, readout_backward = REFERENCE_READOUT[model.loss]
    loss, logits, rcache = readout_loss(h_T, model.params["W_out"], model.params["b_out"], y)
    dW_out, db_out, dh_T = readout_backward(rcache)
    grads, _ = model.cell.reference_backward(p, cache, dh_T, **model.hyper)
    grads.update(W_out=dW_out, b_out=db_out)
    return (loss, grads, logits) if return_logits else (loss, grads)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("name", CELL_NAMES)
def test_reference_bptt_matches_finite_differences(name, loss):
    model = random_model(name, loss=loss)
    x, y = batch(loss=loss)
    _, grads = reference_loss_and_grads(model, x, y)
    assert set(grads) == set(model.params)
    for key, p in model.params.items():
        numeric = numerical_gradient(lambda: reference_loss_and_grads(model, x, y)[0], p,
                                     mask=model.cell.grad_mask(key, N))
        err = relative_error(grads[key], numeric)
        assert err < 1e-6, f"{name}: d{key} relative error {err:.2e}"


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("name", CELL_NAMES)
def test_the_reference_computes_in_float64_whatever_it_is_given(name, loss):
    """float32 parameters and inputs give the oracle's float64 result for the same values."""
    model = random_model(name, dtype="float32", loss=loss)
    x, y = batch(dtype=np.float32, loss=loss)
    y = y.astype(np.float32) if loss == "mse" else y
    loss32, grads32 = reference_loss_and_grads(model, x, y)
    model64 = random_model(name, dtype="float32", loss=loss)
    model64.params = {k: v.astype(np.float64) for k, v in model64.params.items()}
    loss64, grads64 = reference_loss_and_grads(model64, x.astype(np.float64),
                                               y.astype(np.float64) if loss == "mse" else y)
    assert loss32 == loss64
    for k in grads64:
        assert grads32[k].dtype == np.float64 and np.array_equal(grads32[k], grads64[k]), k


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("name", CELL_NAMES)
def test_kernel_bptt_matches_finite_differences(name, loss):
    """The product's own gradient (CPU kernels, full BPTT over T steps) against central
    differences, every parameter tensor of the cell and of the readout, under each loss."""
    model = random_model(name, loss=loss)
    x, y = batch(loss=loss)
    errors = check_model_gradients(model, x, y)
    assert set(errors) == set(model.params)
    bad = {k: e for k, e in errors.items() if e >= 1e-6}
    assert not bad, f"{name}: relative errors {bad}"


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("name", CELL_NAMES)
def test_kernels_match_reference_float64(name, loss):
    model = random_model(name, loss=loss)
    x, y = batch(loss=loss)
    ref_loss, ref_grads, ref_logits = reference_loss_and_grads(model, x, y, return_logits=True)
    loss, grads, logits = model.loss_and_grad(x, y, return_logits=True)
    assert abs(loss - ref_loss) < 1e-12
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-12)
    np.testing.assert_allclose(model.forward(x), ref_logits, rtol=0, atol=1e-12)
    for key in model.params:
        assert relative_error(grads[key], ref_grads[key]) < 1e-10, key

    # the cell alone, from a non-zero initial state: h_T and dL/dh_0 too
    rng = np.random.default_rng(5)
    h0 = rng.standard_normal((B, N))
    dh_T = rng.standard_normal((B, N))
    p = model.cell_params()
    ref_h, ref_cache = model.cell.reference_forward(p, x, h0=h0, **model.hyper)
    ref_g, ref_dh0 = model.cell.reference_backward(p, ref_cache, dh_T, **model.hyper)
    h_T, cache = model.cell.forward(p, np.ascontiguousarray(x.transpose(1, 0, 2)), h0,
                                    **model.hyper)
    g, dh0 = model.cell.backward(p, cache, dh_T, **model.hyper)
    np.testing.assert_allclose(h_T, ref_h, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dh0, ref_dh0, rtol=1e-10, atol=1e-12)
    for key in p:
        assert relative_error(g[key], ref_g[key]) < 1e-10, key


@pytest.mark.parametrize("name", CELL_NAMES)
def test_initial_state_gradient_matches_finite_differences(name):
    """dL/dh_0 from a non-zero h_0, for L = sum(c o h_T) with a random c (so dL/dh_T = c), by the
    reference and by the kernels, against central differences of the reference's h_T. (Training
    starts from h_0 = 0, so the model-level checks above never see this path.)"""
    model = random_model(name)
    x, _ = batch()
    rng = np.random.default_rng(6)
    h0, c = rng.standard_normal((B, N)), rng.standard_normal((B, N))
    p = model.cell_params()

    def loss():
        return float((c * model.cell.reference_forward(p, x, h0=h0, **model.hyper)[0]).sum())

    numeric = numerical_gradient(loss, h0)
    _, ref_cache = model.cell.reference_forward(p, x, h0=h0, **model.hyper)
    _, ref_dh0 = model.cell.reference_backward(p, ref_cache, c, **model.hyper)
    _, cache = model.cell.forward(p, np.ascontiguousarray(x.transpose(1, 0, 2)), h0,
                                  **model.hyper)
    _, dh0 = model.cell.backward(p, cache, c, **model.hyper)
    assert relative_error(ref_dh0, numeric) < 1e-6
    assert relative_error(dh0, numeric) < 1e-6


SECOND_STATES = {"lstm": "c", "peephole-lstm": "c", "cornn": "z", "cornn-imex": "z", "lem": "z"}


@pytest.mark.parametrize("name", list(SECOND_STATES))
def test_a_second_state_s0_and_its_gradient_match_finite_differences(name):
    """The cells with a second state s (the LSTMs' c, coRNN's and LEM's z) take s_0 and dL/ds_T
    (nn.LSTM's (h_0, c_0) and c_n, as nprnn.torch passes them) and leave dL/ds_0 in
    cache["ds0"]: for L = sum(a o h_T) + sum(c o s_T), the kernels and the reference against
    central differences, and the gradients of the parameters against the reference. The models
    themselves start at s_0 = 0 and read h only."""
    s = SECOND_STATES[name]
    model = random_model(name)
    x, _ = batch()
    rng = np.random.default_rng(7)
    h0, s0, a, c = (rng.standard_normal((B, N)) for _ in range(4))
    p = model.cell_params()
    xt = np.ascontiguousarray(x.transpose(1, 0, 2))
    given = {f"{s}0": s0}

    def loss():
        h_T, cache = model.cell.reference_forward(p, x, h0=h0, **given, **model.hyper)
        return float((a * h_T).sum() + (c * cache[f"{s}s"][-1]).sum())

    numeric_s0, numeric_h0 = numerical_gradient(loss, s0), numerical_gradient(loss, h0)
    _, ref_cache = model.cell.reference_forward(p, x, h0=h0, **given, **model.hyper)
    ref_grads, ref_dh0 = model.cell.reference_backward(p, ref_cache, a, **{f"d{s}_T": c},
                                                       **model.hyper)
    _, cache = model.cell.forward(p, xt, h0, **given, **model.hyper)
    np.testing.assert_allclose(cache[f"{s}s"][T], ref_cache[f"{s}s"][-1], rtol=1e-12)
    ds_T = c.copy()
    grads, dh0 = model.cell.backward(p, cache, a, **{f"d{s}_T": ds_T}, **model.hyper)
    np.testing.assert_array_equal(ds_T, c)                 # the caller's array is not written
    for got in (ref_cache[f"d{s}0"], cache[f"d{s}0"]):
        assert relative_error(got, numeric_s0) < 1e-6
    for got in (ref_dh0, dh0):
        assert relative_error(got, numeric_h0) < 1e-6
    for key, want in ref_grads.items():
        assert relative_error(grads[key], want) < 1e-10, key
    with pytest.raises(ValueError, match=rf"{s}0 must have shape \(B, n\) = \(3, 5\), got \(5,\)"):
        model.cell.forward(p, xt, h0, **{f"{s}0": np.ones(N)}, **model.hyper)
    with pytest.raises(ValueError, match=rf"d{s}_T must have shape \(B, n\) = \(3, 5\)"):
        model.cell.backward(p, cache, a, **{f"d{s}_T": np.ones((2, N))}, **model.hyper)


@pytest.mark.parametrize("name", CELL_NAMES)
def test_kernels_match_reference_over_several_row_slices_and_blocks(name):
    """The CPU kernels split the batch into slices of SLICE_ROWS rows and the stacked T*B rows of
    the weight-gradient products into blocks of BLOCK_ROWS; the tiny batch above fits in one of
    each. Here B = 2 * SLICE_ROWS + 2 (a ragged third slice) and T*B > BLOCK_ROWS."""
    from nprnn.kernels.common import BLOCK_ROWS, SLICE_ROWS
    Bb, Tb = 2 * SLICE_ROWS + 2, BLOCK_ROWS // (2 * SLICE_ROWS + 2) + 2
    assert Tb * Bb > BLOCK_ROWS
    model = random_model(name)
    rng = np.random.default_rng(7)
    x, y = 0.5 * rng.standard_normal((Bb, Tb, M)), rng.integers(0, K, size=Bb)
    ref_loss, ref_grads = reference_loss_and_grads(model, x, y)
    loss, grads = model.loss_and_grad(x, y)
    assert abs(loss - ref_loss) < 1e-12
    for key in model.params:
        assert relative_error(grads[key], ref_grads[key]) < 1e-10, key


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("name", CELL_NAMES)
def test_float32_kernels_agree_with_float64(name, loss):
    m64 = random_model(name, loss=loss)
    m32 = random_model(name, dtype="float32", loss=loss)
    for key in m64.params:                      # the same numbers, rounded once
        m32.params[key][...] = m64.params[key]
    x, y = batch(loss=loss)
    loss64, g64 = m64.loss_and_grad(x, y)
    loss32, g32 = m32.loss_and_grad(x.astype(np.float32), y)
    assert abs(loss32 - loss64) < 1e-5 * max(1.0, abs(loss64))
    for key in g64:
        assert g32[key].dtype == np.float32
        assert relative_error(g32[key], g64[key]) < 1e-4, key


# ----------------------------------------------------------------------------------------------
# Properties from the paper
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_diagonal_times_antisymmetric_has_imaginary_eigenvalues(seed):
    """Appendix B, Proposition 3: for antisymmetric W - W^T and positive diagonal D,
    the eigenvalues of D (W - W^T) are purely imaginary."""
    rng = np.random.default_rng(seed)
    n = 12
    W = np.triu(rng.standard_normal((n, n)), k=1)
    d = rng.uniform(0.01, 1.0, size=n)
    eig = np.linalg.eigvals(np.diag(d) @ reference.antisym_matrix(W, 0.0))
    assert np.abs(eig.real).max() < 1e-10 * max(1.0, np.abs(eig).max())


@pytest.mark.parametrize("gamma", [0.001, 0.1, 1.0])
def test_diffusion_makes_jacobian_real_parts_negative(gamma):
    """Section 3.3: with gamma > 0 the Jacobian of the ODE's right-hand side,
    J = diag(tanh'(a)) (W - W^T - gamma I) (eq. 9 with diffusion), has eigenvalues with negative
    real part. J is read off the kernels' own BPTT: one step of eq. (12) with eps = 1 gives
    dh_1/dh_0 = I + J, and a backward pass with dh_1 = I (one batch row per unit) returns it."""
    n = 10
    model = nprnn.make_model("antisym", 2, n, 3, eps=1.0, gamma=gamma, sigma_w=4.0,
                             dtype="float64", seed=3)
    rng = np.random.default_rng(7)
    h0 = np.repeat(rng.standard_normal((1, n)), n, axis=0)       # one state, n copies
    x = np.repeat(rng.standard_normal((1, 1, 2)), n, axis=1)     # (T=1, B=n, m=2)
    p = model.cell_params()
    _, cache = model.cell.forward(p, x, h0, **model.hyper)
    _, dh0 = model.cell.backward(p, cache, np.eye(n), **model.hyper)
    J = dh0 - np.eye(n)                  # row i of dh0 is e_i^T dh_1/dh_0 = row i of I + J
    # J = diag(d) A with d = tanh'(a) in (0, 1]: check it has that form, then its spectrum
    A = reference.antisym_matrix(p["W"], gamma)
    d = np.diag(J @ np.linalg.inv(A))
    np.testing.assert_allclose(J, np.diag(d) @ A, atol=1e-12)
    assert np.all(d > 0) and np.all(d <= 1)
    assert np.linalg.eigvals(J).real.max() < 0
    assert np.linalg.eigvals(np.diag(d) @ reference.antisym_matrix(p["W"], 0.0)).real.max() \
        < 1e-10


def test_antisymmetric_w_gradient_is_strictly_upper_triangular():
    model = random_model("antisym")
    x, y = batch()
    _, grads = model.loss_and_grad(x, y)
    assert np.all(np.tril(grads["W"]) == 0)
    assert np.all(np.tril(model.params["W"]) == 0)


@pytest.mark.parametrize("name", ["antisym", "antisym-gated", "antisym-xgate"])
def test_a_full_w_is_the_same_model_as_its_triangle_with_twice_the_gradient(name):
    """A full W and the triangle U = triu(W - W^T) give the same A, so the same loss; A's
    gradient reaches both W_ij and W_ji, so dW (full) = dA - dA^T is antisymmetric, and its
    upper triangle is the triangle's dU. A full W starts with entries below the diagonal
    (A gets two draws per entry) and counts n^2 parameters; the config records the form."""
    full = random_model(f"{name}[w_form=full]")
    tri = random_model(name)
    assert np.count_nonzero(np.tril(full.params["W"], k=-1)) == N * (N - 1) // 2
    tri.params = {k: v.copy() for k, v in full.params.items()}
    tri.params["W"] = np.triu(full.params["W"] - full.params["W"].T, k=1)
    x, y = batch()
    loss_f, g_f = full.loss_and_grad(x, y)
    loss_t, g_t = tri.loss_and_grad(x, y)
    assert abs(loss_f - loss_t) < 1e-12
    np.testing.assert_allclose(g_f["W"], -g_f["W"].T, rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.triu(g_f["W"], k=1), g_t["W"], rtol=1e-12, atol=1e-15)
    assert full.num_params() == tri.num_params() + N * (N + 1) // 2
    assert full.config["w_form"] == "full" and tri.config["w_form"] == "triangle"
    assert "w_form" not in nprnn.make_model("lstm", 1, 4).config


def test_w_form_is_refused_where_there_is_no_antisymmetric_w_or_the_form_is_unknown():
    for name in ("ablation", "feedback", "lstm", "gru"):
        with pytest.raises(ValueError, match=rf"w_form = 'full' is the form of W in A = W - W\^T "
                                             rf"of antisym, antisym-gated, antisym-xgate; model "
                                             rf"'{name}' has no such W: leave w_form out"):
            nprnn.make_model(name, 1, 4, w_form="full")
    with pytest.raises(ValueError, match="w_form must be one of triangle, full, got 'upper'"):
        nprnn.make_model("antisym", 1, 4, w_form="upper")
    assert nprnn.CELLS["antisym"].w_form == "triangle"     # the registry keeps its default


# ----------------------------------------------------------------------------------------------
# Parameters: names, counts, initialisation
# ----------------------------------------------------------------------------------------------

def test_parameter_counts_match_the_paper():
    """Table 1 and Table 2, '# params' column (rounded to thousands in the paper)."""
    def total(name, n, m, K=10):
        return nprnn.CELLS[name].num_params(m, n) + K * n + K
    assert round(total("antisym", 128, 1) / 1000) == 10
    assert round(total("antisym-gated", 128, 1) / 1000) == 10
    assert round(total("ablation", 196, 3) / 1000) == 42
    assert round(total("antisym", 256, 3) / 1000) == 36
    assert round(total("antisym-gated", 256, 3) / 1000) == 37
    if "lstm" in nprnn.CELLS:
        assert round(total("lstm", 128, 1) / 1000) == 68
        assert round(total("lstm", 128, 3) / 1000) == 69
    model = nprnn.make_model("antisym", 1, 128, 10)
    assert model.num_params() == 128 * 127 // 2 + 128 + 128 + 1290


def expected_params(label, m, n, K=10):
    """Trainable scalars by the formula the cell's spec declares (`count`), and the readout's."""
    name, options = variant(label)
    return nprnn.CELLS[name].with_w_form(options.get("w_form")).count(m, n) + K * n + K


def trainable_entries(model):
    """The trainable scalars of a model as made: every entry of its arrays but those its
    gradient mask holds at 0 (the lower triangle and diagonal of an antisymmetric W)."""
    masks = {k: model.cell.grad_mask(k, model.hidden_size) for k in model.params}
    return sum(int(v.size if masks[k] is None else masks[k].sum())
               for k, v in model.params.items())


@pytest.mark.parametrize("name", CELL_NAMES)
def test_exact_parameter_counts_and_the_params_command(name):
    """The arrays a model is made with, its num_params and what `cli.py params` prints all count
    what its spec's formula declares; for the paper's models, the README's counts exactly."""
    from click.testing import CliRunner

    import cli
    for m, n in [(1, 128), (3, 196), (3, 256)]:
        model = make(name, m, n, 10)
        assert trainable_entries(model) == expected_params(name, m, n), (m, n)
        assert model.num_params() == expected_params(name, m, n), (m, n)
    assert expected_params("lstm", 1, 128) == 68_362                  # the README's table
    assert expected_params("antisym", 1, 128) == 9_674
    assert expected_params("ablation", 3, 196) == 41_954
    if name not in nprnn.CELLS:                        # `params` lists the registry's forms
        return
    out = CliRunner().invoke(cli.cli, ["params"]).output
    row = next(line.split() for line in out.splitlines()[::-1] if line.split()[:1] == [name])
    assert row[1] == f"{expected_params(name, 1, 128):,}"


@pytest.mark.parametrize("name", CELL_NAMES)
def test_parameter_names_shapes_and_dtypes(name):
    m, n = 3, 6
    model = make(name, m, n, 10, dtype="float32")
    shapes = model.cell.shapes(m, n)
    assert list(model.params) == list(shapes) + ["W_out", "b_out"]
    for key, shape in shapes.items():
        assert model.params[key].shape == shape and model.params[key].dtype == np.float32


def test_paper_initialisation_statistics():
    """Appendix C: input-to-hidden N(0, 1/m), hidden-to-hidden N(0, sigma_w^2/n), biases 0."""
    m, n, sigma_w = 50, 400, 2.0
    model = nprnn.make_model("antisym-gated", m, n, 10, sigma_w=sigma_w, dtype="float64")
    p = model.params
    upper = p["W"][np.triu_indices(n, k=1)]
    assert np.all(np.tril(p["W"]) == 0)
    assert abs(upper.var() / (sigma_w ** 2 / n) - 1) < 0.02
    assert abs(p["V_h"].var() * m - 1) < 0.05 and abs(p["V_z"].var() * m - 1) < 0.05
    assert np.all(p["b_h"] == 0) and np.all(p["b_z"] == 0)
    zero = nprnn.make_model("feedback", m, n, 10, sigma_w=0.0)
    assert np.all(zero.params["W"] == 0)
    a, b = (nprnn.make_model("antisym", 2, 8, 3, seed=s) for s in (4, 4))
    for key in a.params:
        np.testing.assert_array_equal(a.params[key], b.params[key])


@pytest.mark.parametrize("name", ["antisym-gated", "ablation", "antisym-xgate"])
def test_gate_bias_starts_b_z_there_and_changes_nothing_else(name):
    """--gate-bias (a deviation from Appendix C's zero biases): b_z starts at the value, every
    other parameter is the draw of gate_bias 0 with the same seed, and the first step's gate
    from h_0 = 0 and x_1 = 0 is sigmoid(gate_bias)."""
    paper, shifted = (nprnn.make_model(name, 2, 6, 3, eps=0.1, seed=5, gate_bias=b,
                                       dtype="float64") for b in (0.0, 1.0))
    assert np.all(paper.params["b_z"] == 0) and np.all(shifted.params["b_z"] == 1)
    for key in paper.params.keys() - {"b_z"}:
        np.testing.assert_array_equal(paper.params[key], shifted.params[key])
    assert shifted.config["gate_bias"] == 1.0
    h1 = shifted.hidden(np.zeros((1, 1, 2)))              # h_1 = eps z tanh(b_h) = 0: b_h is 0
    assert np.all(h1 == 0)
    shifted.params["b_h"][:] = 0.5
    np.testing.assert_allclose(shifted.hidden(np.zeros((1, 1, 2))),
                               0.1 * np.tanh(0.5) / (1 + np.exp(-1.0)), rtol=1e-12)


def test_gate_bias_is_refused_where_there_is_no_gate_or_the_value_is_not_a_number():
    for name in ("antisym", "feedback", "lstm", "gru"):
        with pytest.raises(ValueError, match=rf"gate_bias = 1.0 starts b_z, the gate bias of "
                                             rf"antisym-gated, ablation, antisym-xgate; model "
                                             rf"'{name}' has none: leave gate_bias at 0"):
            nprnn.make_model(name, 1, 4, gate_bias=1)
        nprnn.make_model(name, 1, 4, gate_bias=0.0)                      # the default is fine
    for bad, match in ((float("nan"), "finite"), (1e39, "finite number in float32's range"),
                       ("1", "gate_bias must be a number, got '1'")):
        with pytest.raises(ValueError, match=match):
            nprnn.make_model("antisym-gated", 1, 4, gate_bias=bad)
    assert nprnn.make_model("antisym-gated", 1, 4, gate_bias=1e39,
                            dtype="float64").params["b_z"][0] == 1e39


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_xgate_reads_x_alone_and_is_antisym_gated_otherwise(dtype):
    """antisym-xgate: z_t = sigmoid(V_z x_t + b_z) whatever h_{t-1} is; with V_z = 0, b_z large
    it is antisym-gated's gate held at 1, and both are antisym's step."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 9, 2))
    model = nprnn.make_model("antisym-xgate", 2, 5, 3, eps=0.3, gamma=0.05, sigma_w=2, seed=2,
                             dtype=dtype)
    p = model.params
    cell, xt = model.cell, np.ascontiguousarray(x.transpose(1, 0, 2), dtype=dtype)
    z = {}
    for h0 in (np.zeros((4, 5), dtype), rng.standard_normal((4, 5)).astype(dtype)):
        _, cache = cell.forward(model.cell_params(), xt, h0.copy(), **model.hyper)
        z[h0.any()] = cell.gate_values(cache)["z"].copy()
    expected = 1 / (1 + np.exp(-(xt.astype(np.float64) @ p["V_z"].T.astype(np.float64)
                                 + p["b_z"])))
    tol = 1e-5 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(z[False], expected, rtol=tol)
    np.testing.assert_allclose(z[True], expected, rtol=tol)
    gated = nprnn.make_model("antisym-gated", 2, 5, 3, eps=0.3, gamma=0.05, sigma_w=2, seed=2,
                             dtype=dtype)
    for m in (model, gated):
        m.params["V_z"][:] = 0
        m.params["b_z"][:] = 40.0                 # sigmoid(40 + anything small) is 1
    np.testing.assert_allclose(model.forward(x), gated.forward(x), rtol=tol)


def gate_blocks(a, k):
    """The k stacked gate blocks of a weight or bias, in PyTorch's order."""
    return np.split(a, k)


@pytest.mark.parametrize("name, gates", [("rnn", "h"), ("lstm", "ifgo"), ("peephole-lstm", "ifgo"),
                                         ("gru", "rzn")])
def test_paper_initialisation_of_the_stacked_cells(name, gates):
    """Appendix C for every gate block: weight_ih N(0, 1/m), weight_hh N(0, sigma_w^2/n), biases 0
    but the LSTM's forget gate, whose bias_ih block is 1; peepholes 0."""
    m, n, sigma_w = 60, 300, 2.0
    p = nprnn.make_model(name, m, n, 10, sigma_w=sigma_w, dtype="float64").params
    k = len(gates)
    for gate, w_ih, w_hh, b_ih, b_hh in zip(gates, *(gate_blocks(p[key], k) for key in
                                                    ("weight_ih", "weight_hh", "bias_ih",
                                                     "bias_hh"))):
        assert abs(w_ih.var() * m - 1) < 0.05, gate
        assert abs(w_hh.var() / (sigma_w ** 2 / n) - 1) < 0.02, gate
        assert abs(w_ih.mean()) < 0.01 and abs(w_hh.mean()) < 0.01, gate
        want = 1.0 if "lstm" in name and gate == "f" else 0.0
        assert np.all(b_ih == want) and np.all(b_hh == 0), gate
    for key in ("w_ci", "w_cf", "w_co"):
        assert key not in p or np.all(p[key] == 0)


@pytest.mark.parametrize("name", ["lstm", "peephole-lstm"])
def test_critical_initialisation_follows_appendix_d4(name):
    """Gilboa et al. D.4 per gate (i, f, g, o): weight_ih N(0, nu^2/m), weight_hh N(0, sigma^2/n),
    bias_ih = mu, bias_hh = 0, peepholes 0; the values written out here from the paper."""
    nu2, sigma2, mu = {"lstm": ((1, 0, 1, 0), (1e-5, 1e-5, 1e-5, 1), (0, 1, 0, 0)),
                       "peephole-lstm": ((0, 0, 0, 0), (1e-5,) * 4, (0, 5, 0, 0))}[name]
    m, n = 60, 300
    p = nprnn.make_model(name, m, n, 10, init="critical", dtype="float64").params
    for gate, w_ih, w_hh, b_ih, b_hh, v_in, v_rec, bias in zip(
            "ifgo", *(gate_blocks(p[key], 4) for key in ("weight_ih", "weight_hh", "bias_ih",
                                                         "bias_hh")), nu2, sigma2, mu):
        if v_in == 0:
            assert np.all(w_ih == 0), gate
        else:
            assert abs(w_ih.var() / (v_in / m) - 1) < 0.05, gate
        assert abs(w_hh.var() / (v_rec / n) - 1) < 0.02, gate
        assert np.all(b_ih == bias) and np.all(b_hh == 0), gate
    for key in ("w_ci", "w_cf", "w_co"):
        assert key not in p or np.all(p[key] == 0)


# ----------------------------------------------------------------------------------------------
# Bad arguments give errors that name the bad value and what is allowed
# ----------------------------------------------------------------------------------------------

def test_unknown_model_and_bad_construction_arguments():
    with pytest.raises(ValueError, match=r"unknown model 'antisymm'.*antisym"):
        nprnn.make_model("antisymm", 1, 8)
    with pytest.raises(ValueError, match=r"hidden_size must be an integer >= 1, got 0"):
        nprnn.make_model("antisym", 1, 0)
    with pytest.raises(ValueError, match=r"dtype must be one of .*float16"):
        nprnn.make_model("antisym", 1, 8, dtype="float16")
    with pytest.raises(ValueError, match=r"eps = -0.1 is not allowed: need eps > 0"):
        nprnn.make_model("antisym", 1, 8, eps=-0.1)
    with pytest.raises(ValueError, match=r"init 'critical' is not available for model 'antisym'"):
        nprnn.make_model("antisym", 1, 8, init="critical")
    with pytest.raises(ValueError, match=r"sigma_w = 7.0 has no effect with init 'critical'"):
        nprnn.make_model("lstm", 1, 8, init="critical", sigma_w=7.0)   # D.4 sets the variances
    with pytest.raises(ValueError, match=r"'feedback' has no hyperparameter 'gamma'"):
        nprnn.make_model("feedback", 1, 8, gamma=0.1)
    with pytest.raises(ValueError, match=r"num_classes must be an integer >= 2, got 1"):
        nprnn.make_model("antisym", 1, 8, num_classes=1)
    for seed in (None, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"seed must be an integer >= 0"):
            nprnn.make_model("antisym", 1, 8, seed=seed)
    for dtype in (None, "double precision", "f2", np.int32):
        with pytest.raises(ValueError, match=r"dtype must be one of"):
            nprnn.make_model("antisym", 1, 8, dtype=dtype)
    with pytest.raises(ValueError, match=r"sigma_w must be a number, got '1'"):
        nprnn.make_model("antisym", 1, 8, sigma_w="1")
    with pytest.raises(ValueError, match=r"eps must be a number, got 'abc'"):
        nprnn.make_model("antisym", 1, 8, eps="abc")


def test_the_loss_and_the_output_size_are_checked():
    with pytest.raises(ValueError, match=r"loss must be one of \('xent', 'mse'\), got 'l2'"):
        nprnn.make_model("antisym", 1, 8, loss="l2")
    with pytest.raises(ValueError, match=r"loss must be one of .*, got None"):
        nprnn.make_model("antisym", 1, 8, loss=None)
    with pytest.raises(ValueError, match=r"num_classes must be an integer >= 2, got 1"):
        nprnn.make_model("antisym", 1, 8, num_classes=1, loss="xent")
    with pytest.raises(ValueError, match=r"num_classes must be an integer >= 1, got 0"):
        nprnn.make_model("antisym", 1, 8, num_classes=0, loss="mse")
    with pytest.raises(ValueError, match=r"output_size must be an integer >= 1, got 0"):
        nprnn.make_model("antisym", 1, 8, output_size=0, loss="mse")
    with pytest.raises(ValueError, match=r"output_size must be an integer >= 1, got 1.5"):
        nprnn.make_model("antisym", 1, 8, output_size=1.5, loss="mse")
    with pytest.raises(ValueError, match=r"num_classes = 3 and output_size = 2 differ"):
        nprnn.make_model("antisym", 1, 8, num_classes=3, output_size=2, loss="mse")
    with pytest.raises(ValueError, match=r"loss 'mse' needs the output size"):
        nprnn.make_model("antisym", 1, 8, loss="mse")
    with pytest.raises(ValueError, match=r"output_size = 3 names the outputs of loss 'mse'"):
        nprnn.make_model("antisym", 1, 8, output_size=3)
    # one output is allowed for mse; both names, when alike, are one size
    for kw in (dict(num_classes=1), dict(output_size=1), dict(num_classes=1, output_size=1)):
        model = nprnn.make_model("antisym", 1, 8, loss="mse", **kw)
        assert (model.loss, model.num_classes, model.params["W_out"].shape) == ("mse", 1, (1, 8))
        assert model.config["loss"] == "mse" and model.config["num_classes"] == 1
    # xent as before: the default, 10 classes unless told, and no "loss" in the config
    model = nprnn.make_model("antisym", 1, 8)
    assert (model.loss, model.num_classes) == ("xent", 10) and "loss" not in model.config


def test_mse_targets_are_checked():
    model = nprnn.make_model("antisym", 2, 4, 3, loss="mse")
    x = np.zeros((2, 5, 2), np.float32)
    good = np.zeros((2, 3))
    loss, grads = model.loss_and_grad(x, good)
    assert isinstance(loss, float) and set(grads) == set(model.params)
    assert model.forward(x).shape == (2, 3)
    with pytest.raises(ValueError, match=r"float targets of shape \(2, 3\) .*got dtype float64 "
                                         r"and shape \(2,\)"):
        model.loss_and_grad(x, np.zeros(2))
    with pytest.raises(ValueError, match=r"shape \(2, 3\).*shape \(3, 2\)"):
        model.loss_and_grad(x, np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"float targets .*got dtype int64"):
        model.loss_and_grad(x, np.zeros((2, 3), np.int64))        # labels, not targets
    with pytest.raises(ValueError, match=r"float targets .*got dtype int64 and shape \(2,\)"):
        model.loss_and_grad(x, np.array([0, 1]))
    for bad in (np.nan, np.inf, -np.inf):
        y = good.copy()
        y[1, 2] = bad
        with pytest.raises(ValueError, match=r"NaN or Inf, first y\[1, 2\]"):
            model.loss_and_grad(x, y)
    y = good.copy()
    y[0, 1] = 1e39                                   # finite, but not in the model's float32
    with pytest.raises(ValueError, match=r"beyond float32's range, first y\[0, 1\] = 1e\+39"):
        model.loss_and_grad(x, y)
    model.loss_and_grad(x, good.astype(np.float16))  # any float dtype, as for x


@pytest.mark.parametrize("kwargs, match", [
    (dict(eps=1e-50), r"eps = 1e-50 is beyond float32's range .*: it rounds to 0 there"),
    (dict(eps=1e39), r"eps = 1e\+39 is beyond float32's range .*: it overflows there"),
    (dict(gamma=1e39), r"gamma = 1e\+39 is beyond float32's range"),
    (dict(sigma_w=1e39), r"sigma_w = 1e\+39 draws initial weights beyond float32's range"),
    (dict(eps=1e-40), r"eps = 1e-40 is beyond float32's range .*: it is subnormal there"),
    (dict(sigma_w=1e160, dtype="float64"), r"sigma_w = 1e\+160 is too large: the variance of the "
                                           r"recurrent weights, sigma_w\*\*2 / n, overflows"),
])
def test_hyperparameters_the_models_dtype_cannot_hold_are_refused(kwargs, match):
    """Before, eps = 1e-50 or 1e-40 in float32 gave all-zero cell gradients, eps or gamma = 1e39
    a NaN loss, and sigma_w = 1e160 an OverflowError from the initialisation."""
    with pytest.raises(ValueError, match=match):
        nprnn.make_model("antisym", 1, 4, **kwargs)
    nprnn.make_model("antisym", 1, 4, eps=1e-50, dtype="float64")        # float64 holds it


def test_finite_differences_refuse_a_parameter_they_cannot_perturb():
    """A strided p is copied by reshape, so the perturbation would never reach f (a zero
    gradient); an integer p would round p +- h. Both are refused, as are mismatched shapes."""
    strided = np.arange(6.0).reshape(2, 3).T
    with pytest.raises(ValueError, match="writable, C-contiguous float64 .* got strided float64"):
        numerical_gradient(lambda: float((strided ** 2).sum()), strided)
    whole = np.arange(3)
    with pytest.raises(ValueError, match="got int64 array"):
        numerical_gradient(lambda: float((whole ** 2).sum()), whole)
    p = np.arange(3.0)
    with pytest.raises(ValueError, match=r"mask has shape \(2,\), p has shape \(3,\)"):
        numerical_gradient(lambda: float((p ** 2).sum()), p, mask=np.ones(2))
    np.testing.assert_allclose(numerical_gradient(lambda: float((p ** 2).sum()), p), 2 * p)
    with pytest.raises(ValueError, match=r"analytic has shape \(1,\), numeric has shape "
                                         r"\(4, 4\)"):
        relative_error(np.array([7.0]), np.full((4, 4), 7.0))


def test_construction_arguments_are_normalised():
    """Any NumPy spelling of a dtype, and NumPy integers as sizes, give the plain values that a
    run's config.json records."""
    for dtype, name in ((np.float32, "float32"), ("f4", "float32"), (float, "float64"),
                        (np.dtype("float64"), "float64")):
        assert nprnn.make_model("antisym", 1, 4, dtype=dtype).params["W"].dtype == name
    model = nprnn.make_model("antisym", np.int64(1), np.int32(4), np.int64(3), seed=np.int64(2))
    sizes = (model.input_size, model.hidden_size, model.num_classes)
    assert sizes == (1, 4, 3) and all(type(v) is int for v in sizes)


def test_bad_inputs_are_named():
    model = nprnn.make_model("antisym", 2, 4, 3)
    good = np.zeros((2, 5, 2), np.float32)
    with pytest.raises(ValueError, match=r"m = input_size = 2; got shape \(2, 5, 3\)"):
        model.forward(np.zeros((2, 5, 3), np.float32))
    with pytest.raises(ValueError, match=r"got shape \(5, 2\)"):
        model.forward(np.zeros((5, 2), np.float32))
    with pytest.raises(TypeError, match=r"dtype uint8"):
        model.forward(good.astype(np.uint8))
    with pytest.raises(TypeError, match=r"numpy array"):
        model.forward(good.tolist())
    nan = good.copy()
    nan[1, 3, 0] = np.nan
    with pytest.raises(ValueError, match=r"NaN or Inf, first at index \(b, t, j\) = \(1, 3, 0\)"):
        model.forward(nan)
    with pytest.raises(ValueError, match=r"label 3 out of range.*\[0, 2\]"):
        model.loss_and_grad(good, np.array([0, 3]))
    with pytest.raises(ValueError, match=r"label -1 out of range"):
        model.loss_and_grad(good, np.array([-1, 0]))
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        model.loss_and_grad(good, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"integer labels"):
        model.loss_and_grad(good, np.array([0.0, 1.0]))


def test_inputs_of_any_layout_and_float_dtype_give_the_same_model_outputs():
    """Model._check_x reorders x (B, T, m) to time-major with kernels/layout.py, into a buffer
    kept from call to call: a strided view, a float16 copy and a float64 copy of one batch give
    the logits of the contiguous float32 batch, and a second batch does not see the first."""
    model = nprnn.make_model("antisym", 3, 4, 2, eps=0.5, seed=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 6, 3)).astype(np.float16).astype(np.float32)
    want = model.forward(x)
    wide = np.zeros((5, 12, 3), np.float32)
    wide[:, ::2] = x
    for variant in (wide[:, ::2], x.astype(np.float16), x.astype(np.float64),
                    np.asfortranarray(x)):
        np.testing.assert_allclose(model.forward(variant), want, rtol=1e-6, atol=1e-7)
    other = rng.standard_normal((5, 6, 3)).astype(np.float32)
    first = model.forward(other)
    assert not np.allclose(first, want)
    np.testing.assert_array_equal(model.forward(x), want)
    inf = x.copy()
    inf[4, 0, 2] = -np.inf
    with pytest.raises(ValueError, match=r"NaN or Inf, first at index \(b, t, j\) = \(4, 0, 2\)"):
        model.forward(inf)
    huge = x.astype(np.float64)
    huge[3, 5, 1] = 1e39                     # finite in float64, inf in the model's float32
    with pytest.raises(ValueError, match=r"beyond the range of the model's float32, first "
                                         r"x\[3, 5, 1\] = 1e\+39"):
        model.forward(huge)
    long = x.astype(np.longdouble)           # converted to float32 first: still named right
    long[1, 2, 0] = 1e39
    with pytest.raises(ValueError, match=r"beyond the range of the model's float32, first "
                                         r"x\[1, 2, 0\] = 1e\+39"):
        model.forward(long)
    if np.finfo(np.longdouble).maxexp > 1024:  # wider than float64 (x86), not on every machine
        long[1, 2, 0] = np.longdouble(10) ** 400
        with pytest.raises(ValueError, match=r"x\[1, 2, 0\] = 1e\+400"):
            random_model("antisym", dtype=np.float64).forward(long)


def test_parameters_replaced_with_the_wrong_dtype_or_shape_are_named():
    """Before, a float32 W in a float64 model reached numba as a typing error."""
    model = random_model("antisym")
    x, y = batch()
    model.params["W"] = model.params["W"].astype(np.float32)
    with pytest.raises(ValueError, match=r"model.params\['W'\] is a host array of shape \(5, 5\) "
                                         r"and dtype float32; this cpu model needs shape \(5, 5\) "
                                         r"and dtype float64"):
        model.loss_and_grad(x, y)
    model = random_model("lstm")
    model.params["bias_hh"] = model.params["bias_hh"][:3]
    with pytest.raises(ValueError, match=r"model.params\['bias_hh'\] .* needs shape \(20,\)"):
        model.forward(x)
    del model.params["bias_hh"]
    with pytest.raises(ValueError, match="model.params must hold"):
        model.forward(x)
    model = random_model("rnn")                  # a readout stored as (n, K), then transposed
    model.params["W_out"] = np.ascontiguousarray(model.params["W_out"].T).T
    with pytest.raises(ValueError, match=r"model.params\['W_out'\] is not C-contiguous"):
        model.loss_and_grad(x, y)


@pytest.mark.parametrize("name", ["antisym", "antisym-gated", "rnn", "lstm", "gru"])
def test_h0_and_dh_T_must_hold_one_state_per_batch_row(name):
    """An (n,) vector is refused, not broadcast; a (B - 1, n) dh_T, not read past its end."""
    model = random_model(name)
    x, _ = batch()
    xt = np.ascontiguousarray(x.transpose(1, 0, 2))
    with pytest.raises(ValueError, match=r"h0 must have shape \(B, n\) = \(3, 5\), got \(5,\)"):
        model.cell.forward(model.cell_params(), xt, np.ones(N), **model.hyper)
    _, cache = model.cell.forward(model.cell_params(), xt, None, **model.hyper)
    for shape in [(N,), (2, N)]:
        with pytest.raises(ValueError, match=r"dh_T must have shape \(B, n\) = \(3, 5\), got "
                                             + re.escape(str(shape))):
            model.cell.backward(model.cell_params(), cache, np.ones(shape), **model.hyper)


def test_a_workspace_grows_and_hands_out_views_of_what_it_holds():
    """A smaller or differently typed array that fits is a view of the first bytes; a larger one
    is new memory; names never share."""
    made = []

    def allocate(shape, dtype):
        made.append((shape, np.dtype(dtype).name))
        return np.empty(shape, dtype=dtype)
    ws = nprnn.core.memory.Workspace(allocate)
    a = ws.get("hs", (5, 4, 3), np.float32)
    assert ws.get("hs", [5, 4, 3], "float32") is a
    b = ws.get("hs", (5, 2, 3), np.float32)                # a smaller batch
    c = ws.get("hs", (2, 3), np.float64)                   # another dtype that fits
    assert (b.shape, b.dtype, c.shape, c.dtype) == ((5, 2, 3), np.float32, (2, 3), np.float64)
    assert b.flags.c_contiguous and c.flags.c_contiguous and c.flags.aligned
    assert np.shares_memory(a, b) and np.shares_memory(a, c)
    assert made == [((5, 4, 3), "float32")] and ws.allocations == 1
    d = ws.get("hs", (6, 4, 3), np.float32)                # larger: new memory
    assert made[-1] == ((6, 4, 3), "float32") and not np.shares_memory(a, d)
    assert ws.get("hs", (5, 4, 3), np.float32).base is not None   # now a view of d's memory
    e = ws.get("dhs", (6, 4, 3), np.float32)
    assert made[-1] == ((6, 4, 3), "float32") and not np.shares_memory(d, e)


@pytest.mark.parametrize("name", CELL_NAMES)
def test_training_and_evaluation_batch_sizes_alternate_without_allocating(name):
    """Training at one B and evaluating at a larger one with a short last batch allocate no
    activations once each size has been seen, and the views give what fresh arrays give."""
    model, fresh = random_model(name), random_model(name)
    x, y = batch(seed=1)
    x_eval = np.random.default_rng(2).standard_normal((2 * B + 1, T, M))

    def train_then_evaluate():
        model.loss_and_grad(x, y)
        model.forward(x_eval)
        model.forward(x_eval[:2])
    train_then_evaluate()
    workspaces = (model._workspace, model._inputs)
    allocated = [ws.allocations for ws in workspaces]
    train_then_evaluate()
    loss, grads = model.loss_and_grad(x, y)
    assert [ws.allocations for ws in workspaces] == allocated
    loss_0, grads_0 = fresh.loss_and_grad(x, y)
    assert loss == loss_0
    for k in grads_0:
        np.testing.assert_array_equal(grads[k], grads_0[k], err_msg=k)
    np.testing.assert_array_equal(model.forward(x_eval[:2]), fresh.forward(x_eval[:2]))
