"""coRNN and LEM beyond the registry's checks (which test_cells.py, test_sequences.py,
test_precision.py, test_ptx.py and tests/gpu run on them as on every cell): their
hyperparameters, their official initialisation and weight layouts, and the bounded-state facts
their papers prove (successors.md 1.6 and 2.6), as properties of the CPU kernels over random
weights and inputs. Their agreement with the official formulas written in PyTorch is in
test_torch_compat.py.
"""
import numpy as np
import pytest

import nprnn
from nprnn.core import reference

# (dt, gamma, epsilon) of the official coRNN scripts: adding, sMNIST, psMNIST, noise-padded CIFAR
CORNN_SETTINGS = [(0.06, 66.0, 15.0), (0.042, 2.7, 4.7), (0.076, 0.4, 8.0), (0.034, 1.3, 12.7)]
# dt of the official LEM scripts: adding, sMNIST, psMNIST, noise-padded CIFAR
LEM_DTS = [0.0242, 0.21, 0.31, 0.44]


def states(model, x, h0=None):
    """(y_0 .. y_T, z_0 .. z_T), each (T+1, B, n), of the model's cell over x (B, T, m) by the
    CPU kernels."""
    xt = np.ascontiguousarray(x.transpose(1, 0, 2))
    _, cache = model.cell.forward(model.cell_params(), xt, h0, **model.hyper)
    return np.array(cache["hs"]), np.array(cache["zs"])


def saturated(model, scale, seed=0):
    """The model with every cell parameter drawn N(0, scale^2): large scales saturate the tanh
    (and the sigmoids), the worst case for the bounds."""
    rng = np.random.default_rng(seed)
    for key in model.cell.shapes(1, 1):
        model.params[key][...] = scale * rng.standard_normal(model.params[key].shape)
    return model


# ----------------------------------------------------------------------------------------------
# Hyperparameters: declared by each cell, checked by make_model, recorded by the model
# ----------------------------------------------------------------------------------------------

def test_defaults_are_the_official_smnist_settings_and_the_config_records_them():
    cornn = nprnn.make_model("cornn", 1, 8)
    assert cornn.hyper == dict(dt=0.042, gamma=2.7, epsilon=4.7)
    assert {k: cornn.config[k] for k in ("dt", "gamma", "epsilon")} == cornn.hyper
    assert nprnn.make_model("lem", 1, 8).hyper == dict(dt=0.21)
    given = nprnn.make_model("cornn-imex", 1, 8, dt=0.1, gamma=0.0, epsilon=0)
    assert given.hyper == dict(dt=0.1, gamma=0.0, epsilon=0.0)


@pytest.mark.parametrize("name, kwargs, match", [
    ("cornn", dict(dt=0), r"dt = 0.0 is not allowed: need dt > 0"),
    ("cornn", dict(dt=-0.1), r"dt = -0.1 is not allowed: need dt > 0"),
    ("cornn", dict(epsilon=-1), r"epsilon = -1.0 is not allowed: need epsilon >= 0"),
    ("cornn-imex", dict(gamma=float("inf")), r"gamma = inf is not allowed: need gamma >= 0"),
    ("cornn", dict(dt=float("nan")), r"dt = nan is not allowed: need dt > 0"),
    ("lem", dict(dt=0.0), r"dt = 0.0 is not allowed: need dt > 0"),
    ("lem", dict(dt="0.2"), r"dt must be a number, got '0.2'"),
    ("cornn", dict(dt=1e-50), r"dt = 1e-50 is beyond float32's range .*: it rounds to 0 there"),
    ("cornn", dict(eps=0.1), r"model 'cornn' has no hyperparameter 'eps' \(it takes: dt, "
                             r"gamma, epsilon\)"),
    ("lem", dict(gamma=1.0), r"model 'lem' has no hyperparameter 'gamma' \(it takes: dt\)"),
    ("antisym", dict(dt=0.1), r"model 'antisym' has no hyperparameter 'dt' \(it takes: eps, "
                              r"gamma\)"),
    ("lstm", dict(epsilon=1.0), r"model 'lstm' has no hyperparameter 'epsilon' \(it takes: "
                                r"none\)"),
    ("cornn", dict(gama=1.0), r"model 'cornn' has no hyperparameter 'gama'"),
])
def test_a_hyperparameter_out_of_range_or_not_the_cells_is_refused_in_one_line(name, kwargs,
                                                                               match):
    with pytest.raises(ValueError, match=match):
        nprnn.make_model(name, 1, 4, **kwargs)


# ----------------------------------------------------------------------------------------------
# Initialisation and the official layouts
# ----------------------------------------------------------------------------------------------

def test_the_official_initialisation_and_sigma_w_scaling_the_recurrent_bound():
    """coRNN: nn.Linear(m + 2n, n)'s default, U(-1/sqrt(m + 2n), 1/sqrt(m + 2n)) for weight and
    bias; LEM: every cell parameter U(-1/sqrt(n), 1/sqrt(n)). sigma_w scales the bound of the
    matrices acting on y and z (1: the official initialisation)."""
    m, n = 30, 200
    for name, bound, recurrent in (("cornn", 1 / np.sqrt(m + 2 * n), ("W", "W_z")),
                                   ("lem", 1 / np.sqrt(n), ("weight_hh", "weight_z"))):
        for sigma_w in (1.0, 3.0):
            p = nprnn.make_model(name, m, n, dtype="float64", sigma_w=sigma_w).params
            for key in nprnn.CELLS[name].shapes(m, n):
                b = bound * (sigma_w if key in recurrent else 1.0)
                v = p[key]
                assert np.abs(v).max() < b and np.abs(v).max() > 0.9 * b, (name, key)
                if v.size > 1000:             # U(-b, b): mean 0, variance b^2 / 3
                    assert abs(v.mean()) < 0.05 * b and abs(v.var() / (b * b / 3) - 1) < 0.05


def test_the_cornn_converter_splits_i2h_by_its_columns_x_z_y():
    m, n = 2, 3
    cell = nprnn.CELLS["cornn"]
    # entry (i, c) of the official weight is 100 i + c: every column is told apart
    weight = 100.0 * np.arange(n)[:, None] + np.arange(m + 2 * n)[None, :]
    p = cell.from_official({"cell.i2h.weight": weight, "cell.i2h.bias": np.arange(n) + 0.5,
                            "readout.weight": np.zeros((1, n))})
    assert list(p) == list(cell.shapes(m, n))
    np.testing.assert_array_equal(p["V"], weight[:, :m])
    np.testing.assert_array_equal(p["W_z"], weight[:, m:m + n])
    np.testing.assert_array_equal(p["W"], weight[:, m + n:])
    back = cell.to_official(p)
    np.testing.assert_array_equal(back["i2h.weight"], weight)
    np.testing.assert_array_equal(back["i2h.bias"], np.arange(n) + 0.5)


def test_the_lem_converter_renames_the_official_modules():
    cell = nprnn.CELLS["lem"]
    m, n = 2, 3
    p = nprnn.make_model("lem", m, n, dtype="float64").cell_params()
    official = cell.to_official(p)
    assert {k: v.shape for k, v in official.items()} == {
        "inp2hid.weight": (4 * n, m), "inp2hid.bias": (4 * n,), "hid2hid.weight": (3 * n, n),
        "hid2hid.bias": (3 * n,), "transform_z.weight": (n, n), "transform_z.bias": (n,)}
    again = cell.from_official({f"cell.{k}": v for k, v in official.items()})
    assert list(again) == list(cell.shapes(m, n))
    for k in p:
        np.testing.assert_array_equal(again[k], p[k])


def test_the_imex_form_is_another_map_than_the_codes():
    """The official code damps with z_{t-1}, the paper's eq. (3) with z_t: the same weights give
    other states (successors.md 1.1: differences of 1e-4 and more)."""
    x = np.random.default_rng(0).standard_normal((2, 100, 3))
    code, imex = (nprnn.make_model(name, 3, 8, dtype="float64", seed=4)
                  for name in ("cornn", "cornn-imex"))
    for k in code.params:
        np.testing.assert_array_equal(code.params[k], imex.params[k])
    y_code, y_imex = states(code, x)[0], states(imex, x)[0]
    assert np.abs(y_code - y_imex).max() > 1e-4


# ----------------------------------------------------------------------------------------------
# coRNN: bounded states (successors.md 1.6, P1-P3)
# ----------------------------------------------------------------------------------------------

def cornn_step_matrix(dt, gamma, epsilon, imex):
    """(A, c) of one unit's step x_t = A x_{t-1} + c s_t, x = (y, z): the cell is linear in its
    state but for s_t = tanh(...), which lies in (-1, 1) whatever the weights are."""
    if imex:
        d = 1 + dt * epsilon
        return (np.array([[1 - gamma * dt * dt / d, dt / d], [-gamma * dt / d, 1 / d]]),
                np.array([dt * dt / d, dt / d]))
    return (np.array([[1 - gamma * dt * dt, dt * (1 - epsilon * dt)],
                      [-gamma * dt, 1 - epsilon * dt]]), np.array([dt * dt, dt]))


@pytest.mark.parametrize("imex", [False, True], ids=["code", "imex"])
@pytest.mark.parametrize("dt, gamma, epsilon", CORNN_SETTINGS)
def test_cornn_states_stay_within_the_per_unit_bound(dt, gamma, epsilon, imex):
    """P1: from zero state x_t = sum_k A^k c s_{t-k}, so |y_t| <= B_y = sum_{k<T} |(A^k c)_1|
    and |z_t| <= B_z = sum_{k<T} |(A^k c)_2|, for any weights and inputs: here random and
    saturating ones (|s| near 1)."""
    T = 300
    A, c = cornn_step_matrix(dt, gamma, epsilon, imex)
    terms, v = [], c.copy()
    for _ in range(T):
        terms.append(np.abs(v))
        v = A @ v
    bound_y, bound_z = np.sum(terms, axis=0)
    rng = np.random.default_rng(1)
    name = "cornn-imex" if imex else "cornn"
    for scale in (1.0, 50.0):
        model = saturated(nprnn.make_model(name, 2, 16, dtype="float64", dt=dt, gamma=gamma,
                                           epsilon=epsilon), scale)
        ys, zs = states(model, rng.standard_normal((4, T, 2)))
        assert np.abs(ys).max() <= bound_y * (1 + 1e-12)
        assert np.abs(zs).max() <= bound_z * (1 + 1e-12)
    assert np.abs(ys).max() > 0.2 * bound_y           # saturated: the bound is not idle


@pytest.mark.parametrize("dt, gamma, epsilon", CORNN_SETTINGS)
def test_cornn_imex_energy_grows_at_most_linearly(dt, gamma, epsilon):
    """P2, the IMEX form: where gamma dt + 1 <= 2 epsilon (every official setting),
    ||y_t||^2 + ||z_t||^2 / gamma <= n t dt / gamma from zero state, per sequence."""
    assert gamma * dt + 1 <= 2 * epsilon
    T, n = 200, 16
    model = saturated(nprnn.make_model("cornn-imex", 2, n, dtype="float64", dt=dt, gamma=gamma,
                                       epsilon=epsilon), 50.0, seed=2)
    ys, zs = states(model, np.random.default_rng(3).standard_normal((4, T, 2)))
    energy = (ys ** 2).sum(axis=2) + (zs ** 2).sum(axis=2) / gamma          # (T+1, B)
    t = np.arange(T + 1)[:, None]
    assert np.all(energy <= n * t * dt / gamma * (1 + 1e-12))


@pytest.mark.parametrize("name", ["cornn", "cornn-imex"])
def test_cornn_rests_at_zero_and_settles_at_its_fixed_point(name):
    """P3: all-zero parameters keep y and z exactly 0; a constant drive s = tanh(b) (all
    matrices 0) brings y to s / gamma and z to 0."""
    x = np.random.default_rng(4).standard_normal((3, 50, 2))
    model = nprnn.make_model(name, 2, 5, dtype="float64", dt=0.1, gamma=2.0, epsilon=3.0)
    for v in model.params.values():
        v[...] = 0
    ys, zs = states(model, x)
    assert not ys.any() and not zs.any()
    model.params["b"][...] = np.linspace(-2, 2, 5)
    ys, zs = states(model, np.zeros((3, 3000, 2)))
    np.testing.assert_allclose(ys[-1], np.tile(np.tanh(np.linspace(-2, 2, 5)) / 2.0, (3, 1)),
                               atol=1e-10)
    np.testing.assert_allclose(zs[-1], 0, atol=1e-10)


# ----------------------------------------------------------------------------------------------
# LEM: bounded states (successors.md 2.6, Q1-Q3)
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", LEM_DTS + [1.0])
def test_lem_states_are_convex_combinations_bounded_by_1(dt):
    """Q1: for dt <= 1 both gates lie in (0, dt), so each unit's new state is a convex
    combination of its old one and a tanh: |z_t| <= max(|z_{t-1}|, 1), |y_t| <=
    max(|y_{t-1}|, 1), and from zero state |y_t|, |z_t| < 1, for any weights and inputs (<= 1
    in float64, where a saturated tanh is 1.0)."""
    rng = np.random.default_rng(5)
    for scale in (1.0, 20.0):
        model = saturated(nprnn.make_model("lem", 2, 16, dtype="float64", dt=dt), scale)
        x = rng.standard_normal((4, 200, 2))
        ys, zs = states(model, x)
        assert np.abs(ys).max() <= 1 and np.abs(zs).max() <= 1      # (tanh rounds to 1)
        # from y_0 far outside: never above max(|y_{t-1}|, 1), unit by unit
        ys, zs = states(model, x, h0=3.0 * rng.standard_normal((4, 16)))
        assert np.all(np.abs(ys[1:]) <= np.maximum(np.abs(ys[:-1]), 1) + 1e-15)
        assert np.all(np.abs(zs[1:]) <= np.maximum(np.abs(zs[:-1]), 1) + 1e-15)


@pytest.mark.parametrize("dt", LEM_DTS)
def test_lem_direct_path_jacobian_is_diagonal_between_1_minus_dt_and_1(dt):
    """Q2: through the direct path (weight_hh = weight_z = 0) dy_t/dy_{t-1} = diag(1 - dt sy):
    memory leaks at rate at most dt per step. Read off the kernels' own BPTT: one step, and a
    backward pass with dL/dy_1 = I (one batch row per unit, all from one state)."""
    n = 6
    model = saturated(nprnn.make_model("lem", 2, n, dtype="float64", dt=dt), 2.0, seed=6)
    model.params["weight_hh"][...] = 0
    model.params["weight_z"][...] = 0
    rng = np.random.default_rng(7)
    h0 = np.repeat(rng.standard_normal((1, n)), n, axis=0)
    x = np.repeat(rng.standard_normal((1, 1, 2)), n, axis=1)       # (T=1, B=n, m=2)
    p = model.cell_params()
    _, cache = model.cell.forward(p, x, h0, **model.hyper)
    _, J = model.cell.backward(p, cache, np.eye(n), **model.hyper)
    np.testing.assert_array_equal(J, np.diag(np.diag(J)))
    assert np.all(np.diag(J) >= 1 - dt) and np.all(np.diag(J) < 1)
    sy = model.cell.gate_values(cache)["y_gate"][0, 0]
    np.testing.assert_allclose(np.diag(J), 1 - dt * sy, rtol=1e-14)


def test_lem_rests_at_zero():
    """Q3: all-zero parameters keep both states exactly 0, whatever the input."""
    model = nprnn.make_model("lem", 2, 5, dtype="float64")
    for v in model.params.values():
        v[...] = 0
    ys, zs = states(model, np.random.default_rng(8).standard_normal((3, 40, 2)))
    assert not ys.any() and not zs.any()


def test_the_references_write_the_papers_steps():
    """One step by hand from a non-zero state, against each oracle (which the kernels are held
    to in test_cells.py): coRNN's two forms and LEM's step with the new z_t in y's update."""
    rng = np.random.default_rng(9)
    m, n = 2, 3
    x, y0 = rng.standard_normal((1, 1, m)), rng.standard_normal((1, n))
    p = {k: rng.standard_normal(s) for k, s in nprnn.CELLS["cornn"].shapes(m, n).items()}
    s = np.tanh(p["W"] @ y0[0] + p["V"] @ x[0, 0] + p["b"])                 # z_0 = 0
    dt, gamma, eps = 0.3, 1.5, 2.0
    z_code, z_imex = dt * (s - gamma * y0[0]), dt * (s - gamma * y0[0]) / (1 + dt * eps)
    for form, z in ((reference.cornn_forward, z_code), (reference.cornn_imex_forward, z_imex)):
        y1, cache = form(p, x, dt, gamma, eps, h0=y0)
        np.testing.assert_allclose(cache["zs"][1][0], z, rtol=1e-14)
        np.testing.assert_allclose(y1[0], y0[0] + dt * z, rtol=1e-14)
    p = {k: rng.standard_normal(s) for k, s in nprnn.CELLS["lem"].shapes(m, n).items()}
    A = p["weight_ih"] @ x[0, 0] + p["bias_ih"]
    H = p["weight_hh"] @ y0[0] + p["bias_hh"]
    sig = lambda a: 1 / (1 + np.exp(-a))                                     # noqa: E731
    g_y, g_z = dt * sig(A[:n] + H[:n]), dt * sig(A[n:2 * n] + H[n:2 * n])
    z1 = g_z * np.tanh(A[3 * n:] + H[2 * n:])                               # (1 - g) z_0 = 0
    y1 = (1 - g_y) * y0[0] + g_y * np.tanh(p["weight_z"] @ z1 + p["bias_z"] + A[2 * n:3 * n])
    got, cache = reference.lem_forward(p, x, dt, h0=y0)
    np.testing.assert_allclose(cache["zs"][1][0], z1, rtol=1e-14)
    np.testing.assert_allclose(got[0], y1, rtol=1e-14)
