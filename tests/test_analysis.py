"""nprnn/study/analysis.py, nprnn/study/plotting.py and the `simulate`, `jacobian`, `plot` commands.

The simulations are checked by the numbers the paper states in section 4 (not by the pictures),
the end-to-end Jacobian against central finite differences (float64) for every registered cell,
and each command with and without matplotlib.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import nprnn
from nprnn.runs.saved import open_run
from nprnn.study import analysis as A

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # cli.py is at the repo root
from cli import cli  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def feedback_radii(W):
    """|h_t| (T+1, 3) of the paper's feedback run: eps = 0.1, T = 50, the three initial states."""
    return A.radii(A.simulate(W, A.INITIAL_STATES, A.SIM_STEPS, "feedback", A.SIM_EPS))


# ----------------------------------------------------------------------------------------------
# Section 4: the paper's statements about Figure 1, as numbers
# ----------------------------------------------------------------------------------------------

def test_matrices_have_the_eigenvalues_the_paper_states():
    eig = {k: np.sort_complex(np.linalg.eigvals(W)) for k, (_, W) in A.FEEDBACK_MATRICES.items()}
    np.testing.assert_allclose(eig["W+"], [2, 2])
    np.testing.assert_allclose(eig["W-"], [-2, -2])
    np.testing.assert_allclose(eig["W0"], [-2j, 2j])
    np.testing.assert_allclose(eig["Wdiff"], [-0.15 - 2j, -0.15 + 2j])


def test_feedback_W_plus_radius_grows_at_every_step():
    r = feedback_radii(A.W_PLUS)
    assert (np.diff(r, axis=0) > 0).all()
    assert (r[-1] > 5 * r[0]).all()          # measured: 8.8x to 14.7x


def test_feedback_W_minus_shrinks_towards_zero():
    r = feedback_radii(A.W_MINUS)
    assert (np.diff(r, axis=0) < 0).all()
    assert (r[-1] < 1e-3 * r[0]).all()       # measured: about 2e-4 of the start


def test_feedback_W0_is_an_outward_spiral():
    hs = A.simulate(A.W_ZERO, A.INITIAL_STATES, A.SIM_STEPS, "feedback", A.SIM_EPS)
    r = A.radii(hs)
    growth = r[-1] / r[0]
    assert ((growth > 1.3) & (growth < 1.6)).all(), growth     # measured: 1.58, 1.44, 1.32
    # it turns counter-clockwise at every step: h_{t-1} x h_t > 0
    cross = hs[:-1, :, 0] * hs[1:, :, 1] - hs[:-1, :, 1] * hs[1:, :, 0]
    assert (cross > 0).all()


def test_feedback_W_diff_keeps_its_distance_from_the_origin():
    r = feedback_radii(A.W_DIFF)
    deviation = np.abs(r / r[0] - 1)
    assert (deviation <= 0.1).all(), deviation.max()      # measured: at most 9.1%
    # ...while W0 without diffusion drifts outward by 30% or more
    assert (feedback_radii(A.W_ZERO)[-1] / feedback_radii(A.W_ZERO)[0] > 1.3).all()


def test_vanilla_identity_and_orthogonal_contract_towards_the_origin():
    """|tanh(a)| < |a| componentwise, so for orthogonal W every step shrinks |h| strictly."""
    for W in (np.eye(2), A.random_reflection(0), A.random_rotation(1)):
        r = A.radii(A.simulate(W, A.INITIAL_STATES, A.SIM_STEPS, "vanilla"))
        assert (np.diff(r, axis=0) < 0).all()
        assert (r[-1] < 0.4 * r[0]).all()


def test_orthogonal_draws_are_a_reflection_and_a_rotation():
    for seed in range(5):
        F, R = A.random_reflection(seed), A.random_rotation(seed)
        np.testing.assert_allclose(F @ F.T, np.eye(2), atol=1e-12)
        np.testing.assert_allclose(R @ R.T, np.eye(2), atol=1e-12)
        assert np.linalg.det(F) == pytest.approx(-1)
        assert np.linalg.det(R) == pytest.approx(1)
    assert not np.allclose(A.random_rotation(1), A.random_rotation(2))


def test_figure4_matrices_are_antisymmetric_minus_diffusion():
    for p in A.figure4(steps=3):
        W = np.array(p["W"])
        np.testing.assert_allclose(W + W.T, -2 * A.GAMMA_FIG4 * np.eye(2))
        np.testing.assert_allclose([z[0] for z in p["eigenvalues"]], -A.GAMMA_FIG4)
    assert len({p["W"][0][1] for p in A.figure4(steps=3)}) == 16


def test_figure1_panels():
    panels = A.figure1(steps=4)
    assert [p["kind"] for p in panels] == ["vanilla"] * 4 + ["feedback"] * 4
    assert [round(p["determinant"]) for p in panels[2:4]] == [-1, 1]
    for p in panels:
        assert p["states"].shape == (5, 3, 2)
        np.testing.assert_array_equal(p["states"][0], A.INITIAL_STATES)
    # each panel's matrix, in order: (a) Gaussian (seed), (b) identity, (c) reflection (seed),
    # (d) rotation (seed + 1), (e)-(h) the feedback matrices
    want = [A.gaussian_matrix(4), np.eye(2), A.random_reflection(4), A.random_rotation(5)]
    want += [W for _, W in A.FEEDBACK_MATRICES.values()]
    got = [np.array(p["W"]) for p in A.figure1(steps=2, seed=4)]
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # panels are keyed by the paper's letters (the CSVs' panel column); the feedback matrices
    # also by name
    assert [p["key"] for p in panels] == list("abcdefgh")
    assert [p["matrix"] for p in panels] == [None] * 4 + ["W+", "W-", "W0", "Wdiff"]
    fig5 = A.figure5(steps=2)
    assert [(p["key"], p["matrix"]) for p in fig5] == [("a", "W+"), ("b", "W-"), ("c", "W0"),
                                                       ("d", "Wdiff")]


def test_figure5_is_figure1_plus_input_inside_the_tanh():
    steps = 6
    x = np.random.default_rng(0).standard_normal((steps, 3, 2))
    for p, (_, W) in zip(A.figure5(steps=steps), A.FEEDBACK_MATRICES.values()):
        h = A.INITIAL_STATES.copy()
        for t in range(steps):
            h = h + A.SIM_EPS * np.tanh(h @ W.T + x[t])
        np.testing.assert_allclose(p["states"][-1], h, rtol=1e-14)
        assert not np.allclose(p["states"][-1], A.simulate(W, A.INITIAL_STATES, steps,
                                                           "feedback")[-1])


def test_feedback_panels_agree_with_the_feedback_cell_kernel():
    """The plain NumPy recurrence of section 4 is eq. (12)'s kernel with A = W, V_h = I, b_h = 0."""
    cell = nprnn.CELLS["feedback"]
    steps = 8
    x = np.random.default_rng(0).standard_normal((steps, 3, 2))
    panels = A.figure1(steps)[4:] + A.figure4(steps)[:2] + A.figure5(steps, seed=0)
    for p in panels:
        inputs = x if p["with_input"] else np.zeros_like(x)
        params = dict(W=np.array(p["W"]), V_h=np.eye(2), b_h=np.zeros(2))
        h_T, _ = cell.forward(params, inputs, A.INITIAL_STATES.copy(), eps=A.SIM_EPS)
        np.testing.assert_allclose(h_T, p["states"][-1], rtol=1e-12, atol=1e-14)


def test_vector_field_is_the_ode_right_hand_side():
    X, Y, U, V = A.vector_field(A.W_DIFF, (-1, 1), (-2, 2), num=5)
    assert X.shape == (5, 5)
    h = np.array([X[1, 3], Y[1, 3]])
    np.testing.assert_allclose([U[1, 3], V[1, 3]], np.tanh(A.W_DIFF @ h))


def test_panels_to_rows_and_json():
    panels = A.figure1(steps=2)
    rows = A.panels_to_rows("figure1", panels)
    assert len(rows) == 8 * 3 * 3
    assert rows[0] == dict(figure="figure1", panel="a", trajectory=0, t=0, h1=0.0, h2=0.5,
                           radius=0.5)
    assert "states" not in A.panels_to_json(panels)[0]
    json.dumps(A.panels_to_json(panels))


def test_radii_do_not_overflow_where_the_states_are_finite(tmp_path, no_matplotlib):
    """|h| of states past 1.3e154 (eps = 1e200): the sum of squares overflows, the radius does
    not (nor below 1.5e-154, where the squares underflow); figure1.json has numbers there, not
    null, and no overflow warning gets out."""
    import warnings

    hs = A.simulate(A.W_PLUS, A.INITIAL_STATES, 3, "feedback", 1e200)
    assert np.abs(hs).max() > 1e200
    np.testing.assert_allclose(A.radii(hs), 1e200 * A.radii(hs / 1e200), rtol=1e-15)
    h0 = A.INITIAL_STATES[None]                           # (1, 3, 2), |h| from 0.5 to 0.9
    for scale in (1e300, 1e-300):
        np.testing.assert_allclose(A.radii(scale * h0), scale * A.radii(h0), rtol=1e-15)
    np.testing.assert_allclose(A.radii(hs)[0], np.linalg.norm(A.INITIAL_STATES, axis=-1),
                               rtol=1e-15)
    assert A.radii(np.array([[[-2.0]]])) == 2.0                          # n = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = run_cli(["simulate", "--out", str(tmp_path), "--figures", "1", "--eps", "1e200",
                       "--steps", "3"])
    assert "inf" not in out
    panels = json.loads((tmp_path / "figure1.json").read_text())["panels"]
    assert all(r is not None and r > 1e199 for p in panels[4:] for r in p["radius_end"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(W=np.eye(3)), "shape"),
    (dict(kind="lstm"), "kind"),
    (dict(steps=0), "steps"),
    (dict(eps=0.0), "eps"),
    (dict(inputs=np.zeros((4, 3, 2))), "inputs"),
    (dict(eps=1e307, steps=50), "overflow float64 within 50 steps at eps=1e[+]307"),
])
def test_simulate_rejects_bad_input(kwargs, match):
    args = dict(W=np.eye(2), h0=A.INITIAL_STATES, steps=5, kind="feedback", eps=0.1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        A.simulate(**args)


def test_simulation_figure_rejects_unknown_figure():
    with pytest.raises(ValueError, match="no simulation figure 2"):
        A.simulation_figure(2)


# ----------------------------------------------------------------------------------------------
# The end-to-end Jacobian dh_T / dh_0
# ----------------------------------------------------------------------------------------------

def tiny_model(name, **kw):
    hyper = nprnn.CELLS[name].hyper
    return nprnn.make_model(name, input_size=2, hidden_size=3, num_classes=2,
                            sigma_w=kw.get("sigma_w", 2.0),
                            dtype="float64", seed=1, eps=0.7 if "eps" in hyper else None,
                            gamma=kw.get("gamma", 0.1) if "gamma" in hyper else None,
                            dt=0.5 if "dt" in hyper else None)


def fd_jacobian(model, x, h0, delta=1e-6):
    """J[:, j] = (h_T(h0 + delta e_j) - h_T(h0 - delta e_j)) / (2 delta), from the forward pass."""
    n = model.hidden_size
    xt = np.ascontiguousarray(x[:, None, :])          # (T, 1, m)

    def h_T(h):
        out, _ = model.cell.forward(model.cell_params(), xt, h[None, :].copy(), **model.hyper)
        return out[0]

    J = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = delta
        J[:, j] = (h_T(h0 + e) - h_T(h0 - e)) / (2 * delta)
    return J


@pytest.mark.parametrize("name", sorted(nprnn.CELLS))
def test_jacobian_matches_finite_differences(name):
    model = tiny_model(name)
    x = np.random.default_rng(2).standard_normal((4, 2))
    h0 = np.array([0.3, -0.2, 0.5])
    J = A.end_to_end_jacobian(model, x, h0)
    J_fd = fd_jacobian(model, x, h0)
    assert np.abs(J - np.eye(3)).max() > 1e-2         # a Jacobian worth checking
    rel = np.abs(J - J_fd).max() / max(np.abs(J_fd).max(), 1e-12)
    assert rel < 1e-7, (name, J, J_fd)


def test_jacobian_of_a_single_step_is_the_formula():
    """T = 1, antisym from h0 = 0: J = I + eps diag(1 - tanh(a)^2) A, a = V_h x_1 + b_h."""
    model = tiny_model("antisym", gamma=0.3)
    x = np.random.default_rng(3).standard_normal((1, 2))
    p = model.params
    A_mat = p["W"] - p["W"].T - 0.3 * np.eye(3)
    a = p["V_h"] @ x[0] + p["b_h"]
    expected = np.eye(3) + 0.7 * (1 - np.tanh(a) ** 2)[:, None] * A_mat
    np.testing.assert_allclose(A.end_to_end_jacobian(model, x), expected, rtol=1e-13)


def test_more_diffusion_shrinks_the_eigenvalues():
    xs = A.gaussian_sequences(2, 12, 2, seed=0)
    models = [(f"g={g:g}", tiny_model("antisym", gamma=g)) for g in (0.0, 2.0)]
    rows = A.jacobian_spectra(models, [12], lambda T: xs)
    assert [r["label"] for r in rows] == ["g=0", "g=2"]
    assert rows[1]["mean"] < 0.5 * rows[0]["mean"]
    assert rows[0]["sequences"] == 2 and rows[0]["T"] == 12 and rows[0]["gamma"] == 0.0
    assert A.eigenvalue_magnitudes(models[0][1], xs).shape == (2, 3)


@pytest.mark.parametrize("name", list(nprnn.CELLS))
def test_a_cell_ignores_h0_where_its_jacobian_is_0_in_any_dtype(name):
    """Cell.ignores_h0: h_T does not depend on h_0 (rnn and the LSTMs with weight_hh = 0, as
    sigma_w = 0 makes it), so J is exactly 0 and not by underflow; every other cell and sigma_w
    gives a J that is not 0."""
    x = np.random.default_rng(2).standard_normal((4, 2))
    h0 = np.random.default_rng(3).standard_normal(3)
    for sigma_w in (0.0, 2.0):
        model = tiny_model(name, sigma_w=sigma_w)
        ignores = model.cell.ignores_h0(model.cell_params())
        assert ignores == (sigma_w == 0 and name in ("rnn", "lstm", "peephole-lstm")), sigma_w
        J = A.end_to_end_jacobian(model, x, h0)
        assert (not J.any()) == ignores, J
        if ignores:
            np.testing.assert_array_equal(fd_jacobian(model, x, h0), 0.0)   # not rounding


def test_jacobian_tells_a_jacobian_of_0_from_eigenvalues_rounded_to_0(tmp_path, no_matplotlib):
    out = run_cli(["jacobian", "--out", str(tmp_path), "--models", "lstm,gru", "--lengths", "3",
                   "--hidden-size", "3", "--input-size", "1", "--sequences", "1", "--sigma-w",
                   "0", "--dtype", "float32"])
    assert ("note: J is 0 for lstm: h_T does not depend on h_0 (its recurrent weights are 0); "
            "the figure leaves these points out") in out
    assert "rounded" not in out and "underflow" not in out
    # |W| ~ 1e-20: J ~ 1e-60, below float32's 1e-45 but a number in float64
    args = ["jacobian", "--out", str(tmp_path), "--models", "rnn", "--lengths", "3",
            "--hidden-size", "2", "--input-size", "1", "--sequences", "1", "--sigma-w", "1e-20"]
    out = run_cli(args + ["--dtype", "float32"])
    assert ("note: every eigenvalue rounded to 0 in float32 for rnn at T=3 (--dtype float64 "
            "holds numbers down to 1e-308); the figure leaves these points out") in out
    assert "J is 0" not in out
    assert "note:" not in run_cli(args + ["--dtype", "float64"])


def test_jacobian_spectra_of_huge_eigenvalues():
    """feedback at sigma_w = 16, eps = 3 grows |lambda| by about 10^0.1 a step: past 1e154 at
    T = 2000, where the magnitudes' squares (and a plain std) overflow; past float32 at 600."""
    models = A.jacobian_models(["feedback"], [], 4, 2, 3.0, sigma_w=16, seed=0, dtype="float64")
    xs = A.gaussian_sequences(2, 2000, 2, seed=0)
    (row,) = A.jacobian_spectra(models, [2000], lambda T: xs)
    mags = A.eigenvalue_magnitudes(models[0][1], xs)
    assert 1e154 < row["max"] < 1e300 and row["std"] == pytest.approx(1e150 * (mags / 1e150).std())
    models = A.jacobian_models(["feedback"], [], 4, 2, 3.0, sigma_w=16, seed=0, dtype="float32")
    with pytest.raises(ValueError, match=r"dh_T/dh_0 of feedback overflows float32 \(entries "
                                         r"beyond 3.4e\+38\) at T = 600: choose a shorter T, "
                                         r"or float64"):
        A.eigenvalue_magnitudes(models[0][1], xs[:, :600])


def test_jacobian_rejects_bad_input():
    model = tiny_model("antisym")
    with pytest.raises(ValueError, match="m = input_size = 2"):
        A.end_to_end_jacobian(model, np.zeros((4, 3)))
    with pytest.raises(ValueError, match="h0 must have shape"):
        A.end_to_end_jacobian(model, np.zeros((4, 2)), h0=np.zeros(2))
    with pytest.raises(ValueError, match="NaN"):
        A.end_to_end_jacobian(model, np.full((4, 2), np.nan))


# ----------------------------------------------------------------------------------------------
# Run folders
# ----------------------------------------------------------------------------------------------

def make_run(root, name, model="antisym", task="mnist", iterations=(0, 10, 20), extra=None):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(dict(model=model, task=task, lr=0.1)))
    lines = []
    for it in iterations:
        lines.append(dict(iteration=it, split="train", loss=2.3 / (1 + it), accuracy=0.1,
                          lr=0.1, seconds=1.0))
        lines.append(dict(iteration=it, split="test", loss=2.4 / (1 + it),
                          accuracy=min(0.9, 0.1 + it / 30)))
    text = "\n".join(json.dumps(r) for r in lines) + "\n" + (extra or "")
    (d / "metrics.jsonl").write_text(text)
    return d


def test_learning_curves_draw_what_the_run_logged(tmp_path, monkeypatch):
    """Both panels hold the training line and the evaluation split, with the logged values (a
    plot of the wrong split still made a PNG; the training accuracy was not drawn, so the first
    run's accuracy panel was a single dot)."""
    pytest.importorskip("matplotlib")
    from nprnn.study import plotting
    made = []
    figure = plotting._figure
    monkeypatch.setattr(plotting, "_figure", lambda **kw: made.append(figure(**kw)) or made[-1])
    runs = A.read_runs([make_run(tmp_path, "a")])
    plotting.plot_learning_curves(runs, tmp_path / "c.png")
    ax_loss, ax_acc = made[0].axes

    def lines(ax):
        return {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()}
    assert lines(ax_acc) == {"train": [0.1, 0.1, 0.1], "test": [0.1, 0.1 + 10 / 30, 0.1 + 20 / 30]}
    assert lines(ax_loss) == {"train": [2.3, 2.3 / 11, 2.3 / 21],
                              "test": [2.4, 2.4 / 11, 2.4 / 21]}


def test_read_runs(tmp_path):
    runs = A.read_runs([make_run(tmp_path, "a"), make_run(tmp_path, "b", model="lstm"),
                        make_run(tmp_path, "c", model="lstm")])
    assert [r["label"] for r in runs] == ["antisym on mnist", "lstm on mnist (b)",
                                          "lstm on mnist (c)"]
    it, acc = A.curve(runs[0], "test", "accuracy")
    np.testing.assert_array_equal(it, [0, 10, 20])
    np.testing.assert_allclose(acc, [0.1, 0.1 + 1 / 3, 0.1 + 2 / 3])
    rows = A.runs_to_rows(runs)
    assert len(rows) == 18 and set(rows[0]) == {"run", "label", "model", "task", "iteration",
                                                "split", "loss", "accuracy"}


def test_results_give_each_runs_settings_reach_and_last_and_best_accuracy(tmp_path):
    """`results` on an unfinished run evaluated on the test split and on a sweep trial evaluated
    on valid (whose final test evaluation is not its split): iterations logged of those asked
    for, the last "time" logged, and the last and the best evaluation (the earlier of a tie)."""
    gated = make_run(tmp_path, "gated", model="antisym-gated")
    (gated / "config.json").write_text(json.dumps(dict(
        model="antisym-gated", task="mnist", hidden=128, T=None, eps=0.01, gamma=0.1,
        sigma_w=2.0, optimizer="sgd", lr=0.4, seed=1, init="paper", clip=0.0, iterations=50000,
        valid_size=0, eval_split="test", gate_bias=1.0, pixels="standardised")))
    trial = make_run(tmp_path, "0007", iterations=(0, 10, 20, 30))
    (trial / "config.json").write_text(json.dumps(dict(
        model="antisym", task="mnist-noise", hidden=16, T=28, eps=0.1, gamma=0.01, sigma_w=1.0,
        optimizer="adagrad", lr=0.123456789, seed=0, init="paper", clip=1.0, iterations=30,
        valid_size=50, batch_size=20, dtype="float32")))
    with open(trial / "metrics.jsonl", "a") as f:
        for it, acc in ((10, 0.5), (20, 0.7), (30, 0.7)):
            f.write(json.dumps(dict(iteration=it, split="valid", accuracy=acc, time=60.0 * it))
                    + "\n")
        f.write(json.dumps(dict(iteration=30, split="test", accuracy=0.99, time=1900.0)) + "\n")
    g, t = (A.run_summary(r) for r in A.read_runs([gated, trial]))
    assert g == dict(name="gated", model="antisym-gated", task="mnist", settings="hidden 128, "
                     "eps 0.01, gamma 0.1, sigma_w 2, optimizer sgd, lr 0.4, seed 1, "
                     "gate_bias 1, pixels standardised",
                     reached=20, planned=50000, time=None, split="test",
                     last=(20, 0.1 + 20 / 30), best=(20, 0.1 + 20 / 30), metric="accuracy",
                     baseline=None)
    assert t["settings"] == ("hidden 16, T 28, eps 0.1, gamma 0.01, sigma_w 1, optimizer "
                             "adagrad, lr 0.123456789, seed 0, clip 1, batch_size 20")
    assert (t["split"], t["last"], t["best"], t["time"]) == ("valid", (30, 0.7), (20, 0.7), 1900)

    fresh = make_run(tmp_path, "fresh", iterations=())        # started: nothing logged yet
    out = run_cli(["results", str(gated), str(trial), str(fresh)]).splitlines()
    assert out[0].split() == ["run", "model", "task", "settings", "iterations", "time", "split",
                              "last", "best"]
    assert re.split(r"\s{2,}", out[1])[4:] == ["20 of 50,000", "-", "test", "76.67% at 20",
                                               "76.67% at 20"]
    assert re.split(r"\s{2,}", out[2]) == [
        "0007", "antisym", "mnist-noise", t["settings"], "30 of 30", "32 min", "valid",
        "70.00% at 30", "70.00% at 20"]
    assert re.split(r"\s{2,}", out[3])[4:] == ["0", "-", "test", "-", "-"]
    md = run_cli(["results", "--markdown", str(trial)]).splitlines()
    assert md[1] == "|---|---|---|---|---|---|---|---|---|" and md[2] == (
        f"| 0007 | antisym | mnist-noise | {t['settings']} | 30 of 30 | 32 min | valid | "
        "70.00% at 30 | 70.00% at 20 |")
    result = CliRunner().invoke(cli, ["results", str(tmp_path)])      # not a run folder
    assert result.exit_code == 1 and "config.json not found" in result.output


@pytest.mark.parametrize("extra, match", [
    ("not json\n", "line 7 is not valid JSON"),
    ('{"iteration": 1.5, "split": "train", "loss": 1}\n', "'iteration' must be an integer"),
    ('{"iteration": 1, "loss": 1}\n', "'split' must be a string"),
    ('{"iteration": 1, "split": "train", "loss": "high"}\n', "'loss' must be a number"),
    ("[1, 2]\n", "expected a JSON object"),
])
def test_read_run_names_the_bad_line(tmp_path, extra, match):
    with pytest.raises(ValueError, match=match):
        A.read_run(make_run(tmp_path, "r", extra=extra))


def test_read_run_needs_both_files_and_the_keys(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        A.read_run(d)
    (d / "config.json").write_text(json.dumps(dict(model="antisym")))
    (d / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="'model' and 'task'"):
        A.read_run(d)
    (d / "config.json").write_text(json.dumps(dict(model="antisym", task="mnist")))
    with pytest.raises(ValueError, match="no records"):
        A.read_run(d)


# ----------------------------------------------------------------------------------------------
# The commands, with and without matplotlib
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def no_matplotlib(monkeypatch):
    """Make every `import matplotlib...` fail, as on an install without the plot extra."""
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def run_cli(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def is_png(path):
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def test_learning_curves_tell_the_splits_and_many_runs_apart(tmp_path, monkeypatch):
    """A run with --valid-size logs valid evaluations and a final test one: the two get their
    own markers. Twelve runs get twelve colours (matplotlib's cycle has ten), named once each in
    one legend beside the panels."""
    pytest.importorskip("matplotlib")
    from nprnn.study import plotting
    made = []
    figure = plotting._figure
    monkeypatch.setattr(plotting, "_figure", lambda **kw: made.append(figure(**kw)) or made[-1])
    valid = json.dumps(dict(iteration=20, split="valid", loss=0.2, accuracy=0.6))
    runs = A.read_runs([make_run(tmp_path, "a", extra=valid + "\n")])
    plotting.plot_learning_curves(runs, tmp_path / "c.png")
    marker = {ln.get_label().rsplit(", ", 1)[-1]: ln.get_marker()
              for ln in made[0].axes[1].get_lines()}
    assert marker["valid"] != marker["test"]
    runs = A.read_runs([make_run(tmp_path, f"r{k}") for k in range(12)])
    plotting.plot_learning_curves(runs, tmp_path / "c12.png")
    colors = {ln.get_label().split(", ")[0]: ln.get_color() for ln in made[1].axes[1].get_lines()}
    assert len(colors) == 12 and len({tuple(np.atleast_1d(c)) for c in colors.values()}) == 12
    # one legend beside the panels, naming each run once and each mark once
    assert all(ax.get_legend() is None for ax in made[1].axes)
    (legend,) = made[1].legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == [run["label"] for run in runs] + ["train", "test"]


def test_figures_label_their_axes_explain_their_marks_and_are_print_sized(tmp_path,
                                                                          monkeypatch):
    """What a reviewer asks of a figure, checked on the figure objects: every panel's axes
    labelled, mathtext for the paper's symbols, a legend for every mark (the stars and the fade
    of the simulations, each model and split), no legend over the gate curves, and print size
    (the PNGs at 150 dpi, over 1,500 pixels wide)."""
    pytest.importorskip("matplotlib")
    from nprnn.study import plotting
    made = []
    figure = plotting._figure
    monkeypatch.setattr(plotting, "_figure", lambda **kw: made.append(figure(**kw)) or made[-1])

    def png_width(path):
        return int.from_bytes(path.read_bytes()[16:20], "big")

    panels, caption = A.simulation_figure(5, steps=5)
    plotting.plot_simulation(panels, tmp_path / "f5.png", 4, caption)
    fig = made[-1]
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert all(ax.get_xlabel() == "$h_1$" for ax in axes)            # one row: all at the bottom
    assert axes[0].get_ylabel() == "$h_2$" and "$" in axes[0].get_title()
    assert "$h_{t-1}$" in fig.get_suptitle() and "h_(t-1)" not in fig.get_suptitle()
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert any("initial state" in t for t in texts) and any("opaque" in t for t in texts)
    assert any("vector field" in t for t in texts)
    assert png_width(tmp_path / "f5.png") >= 1500

    rows = [dict(label=label, model=model, T=T, mean=mean, std=0.01)
            for label, model, f in (("antisym gamma=0.01", "antisym", 0.99),
                                    ("lstm", "lstm", 1e-3))
            for T, mean in ((10, f), (20, f ** 2))]
    plotting.plot_jacobian(rows, tmp_path / "f2.png", "dh_T/dh_0")
    fig = made[-1]
    assert len(fig.axes) == 3                      # the mean near 1 has a panel of its own
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None
    assert "$\\gamma$" in fig.axes[0].get_legend().get_texts()[0].get_text()
    assert png_width(tmp_path / "f2.png") >= 1500

    runs = A.read_runs([make_run(tmp_path, "a")])
    plotting.plot_learning_curves(runs, tmp_path / "c.png")
    fig = made[-1]
    for ax in fig.axes:
        assert ax.get_xlabel() == "iteration" and ax.get_ylabel()
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train", "test"]
    low, high = fig.axes[1].get_ylim()
    assert 0 < high <= 1 and high - low < 1        # the accuracy axis spans the data
    assert png_width(tmp_path / "c.png") >= 1500

    gates = [dict(label="antisym-gated", task="mnist-noise", T=4, image_steps=2, sequences=3,
                  steps={"z": dict(mean=[0.5] * 4, std=[0.1] * 4)})]
    plotting.plot_gates(gates, tmp_path / "g.png")
    (ax,) = made[-1].axes
    assert ax.get_xlabel() and ax.get_ylabel() == "gate value"
    legend = ax.get_legend()
    assert legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1   # beside the panel
    assert any("noise begins" in t.get_text() for t in legend.get_texts())


def test_matplotlib_is_not_imported_by_the_library():
    code = ("import sys, nprnn, nprnn.study.analysis, nprnn.study.plotting; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_figure_records_only_the_settings_it_uses(tmp_path, no_matplotlib):
    """Figure 3 has no eps, and Figures 3 and 4 take their seeds from the paper (1..16): their
    JSON says null there rather than a value that changed nothing."""
    for number, used in ((1, ("eps", "seed")), (3, ()), (4, ("eps",)), (5, ("eps", "seed"))):
        _, summary = A.simulation_summary(number, 4, eps=0.3, seed=7)
        assert (summary["eps"], summary["seed"]) == (0.3 if "eps" in used else None,
                                                   7 if "seed" in used else None), number
    seed7, seed8 = (A.simulation_summary(4, 4, eps=0.3, seed=s)[1] for s in (7, 8))
    assert A.panels_to_json(A.figure4(4, 0.3)) == seed7["panels"] == seed8["panels"]
    run_cli(["simulate", "--out", str(tmp_path), "--figures", "3,4,5", "--steps", "4",
             "--seed", "7", "--eps", "0.3"])
    saved = {n: json.loads((tmp_path / f"figure{n}.json").read_text()) for n in (3, 4, 5)}
    assert [(saved[n]["eps"], saved[n]["seed"]) for n in (3, 4, 5)] == [
        (None, None), (0.3, None), (0.3, 7)]


def test_simulate_command(tmp_path):
    pytest.importorskip("matplotlib")
    out = run_cli(["simulate", "--out", str(tmp_path), "--steps", "5", "--figures", "1,5"])
    assert "W0" in out
    for n in (1, 5):
        assert is_png(tmp_path / f"figure{n}.png")
    summary = json.loads((tmp_path / "figure1.json").read_text())
    assert len(summary["panels"]) == 8 and summary["steps"] == 5
    lines = (tmp_path / "figure1.csv").read_text().splitlines()
    assert lines[0] == "figure,panel,trajectory,t,h1,h2,radius" and len(lines) == 1 + 8 * 3 * 6
    assert sorted({line.split(",")[1] for line in lines[1:]}) == list("abcdefgh")
    assert "\n  g W0     feedback" in out
    result = CliRunner().invoke(cli, ["simulate", "--out", str(tmp_path), "--eps", "1e307"])
    assert result.exit_code == 1 and result.output == (
        "Error: the states overflow float64 within 50 steps at eps=1e+307: choose a smaller eps "
        "or fewer steps\n")


def test_jacobian_command(tmp_path):
    pytest.importorskip("matplotlib")
    out = run_cli(["jacobian", "--out", str(tmp_path), "--models", "antisym,lstm",
                   "--gammas", "0.01,1", "--lengths", "3,5", "--hidden-size", "3",
                   "--input-size", "2", "--sequences", "2"])
    assert "antisym gamma=0.01" in out and "lstm" in out
    assert is_png(tmp_path / "figure2_jacobian.png")
    rows = json.loads((tmp_path / "figure2_jacobian.json").read_text())["rows"]
    assert [(r["label"], r["T"]) for r in rows] == [
        ("antisym gamma=0.01", 3), ("antisym gamma=1", 3), ("lstm", 3),
        ("antisym gamma=0.01", 5), ("antisym gamma=1", 5), ("lstm", 5)]
    assert len((tmp_path / "figure2_jacobian.csv").read_text().splitlines()) == 7


def test_plot_command(tmp_path):
    pytest.importorskip("matplotlib")
    a, b = make_run(tmp_path, "a"), make_run(tmp_path, "b", model="lstm", task="cifar10")
    out = run_cli(["plot", str(a), str(b), "--out", str(tmp_path / "figs")])
    assert "lstm on cifar10" in out and "replacing" not in out
    assert is_png(tmp_path / "figs" / "learning_curves.png")
    assert len((tmp_path / "figs" / "learning_curves.csv").read_text().splitlines()) == 13
    out = run_cli(["plot", str(a), "--out", str(tmp_path / "figs")])
    assert f"replacing the earlier {tmp_path / 'figs' / 'learning_curves.png'}" in out


def test_runs_in_folders_of_one_name_keep_apart(tmp_path):
    runs = A.read_runs([make_run(tmp_path / "1", "run"), make_run(tmp_path / "2", "run")])
    assert [r["name"] for r in runs] == [os.path.join("1", "run"), os.path.join("2", "run")]
    assert [r["label"] for r in runs] == [f"antisym on mnist ({r['name']})" for r in runs]
    with pytest.raises(ValueError, match="is given twice"):
        A.read_runs([make_run(tmp_path, "a")] * 2)


def test_json_has_null_where_a_number_is_not_finite(tmp_path):
    A.write_json(tmp_path / "x.json", dict(a=[1.0, float("nan")], b=np.float64(-np.inf)))
    assert json.loads((tmp_path / "x.json").read_text()) == dict(a=[1.0, None], b=None)


def test_a_writer_that_fails_halfway_leaves_the_earlier_file(tmp_path):
    """write_csv, write_json and the PNGs write to a temporary beside the file and move it into
    place only when it is whole: a failure (or a kill) halfway leaves the earlier file as it was,
    and no temporary stays behind."""
    import socket
    from nprnn.study import plotting

    csv_path, json_path, png_path = tmp_path / "f.csv", tmp_path / "f.json", tmp_path / "f.png"
    A.write_csv(csv_path, [dict(a=1, b=2)])
    A.write_json(json_path, dict(a=1))
    png_path.write_bytes(PNG_MAGIC + b"earlier")
    before = {p: p.read_bytes() for p in (csv_path, json_path, png_path)}
    rows = [dict(a=k, b=k) for k in range(1000)] + [dict(a=0, c=0)]     # the last one is bad
    with pytest.raises(ValueError, match="fields not in fieldnames"):
        A.write_csv(csv_path, rows)
    with pytest.raises(TypeError, match="not JSON serializable"):
        A.write_json(json_path, dict(a=list(range(1000)), b={1, 2}))
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.csv", "f.json", "f.png"]

    class HalfAFigure:
        def savefig(self, path, **kwargs):
            Path(path).write_bytes(PNG_MAGIC)
            raise OSError("No space left on device")
    with pytest.raises(OSError, match="No space left"):
        plotting._save(HalfAFigure(), png_path, dpi=110)
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.csv", "f.json", "f.png"]
    # what a killed writer left (its process is gone) goes at the next write into the folder
    stale = tmp_path / f".f.csv.tmp-{socket.gethostname()}-{2**22 + 1}-0000"
    stale.write_text("a,b\n1,")
    A.write_csv(csv_path, [dict(a=3, b=4)])
    assert not stale.exists() and csv_path.read_text() == "a,b\n3,4\n"


def test_commands_write_numbers_without_matplotlib(tmp_path, no_matplotlib):
    out = run_cli(["simulate", "--out", str(tmp_path), "--steps", "3", "--figures", "4"])
    assert "pip install -e '.[plot]'" in out
    assert (tmp_path / "figure4.json").is_file() and (tmp_path / "figure4.csv").is_file()
    out = run_cli(["jacobian", "--out", str(tmp_path), "--models", "antisym", "--gammas", "0.1",
                   "--lengths", "2", "--hidden-size", "2", "--input-size", "1",
                   "--sequences", "1"])
    assert "pip install -e '.[plot]'" in out and (tmp_path / "figure2_jacobian.csv").is_file()
    out = run_cli(["plot", str(make_run(tmp_path, "r")), "--out", str(tmp_path)])
    assert "pip install -e '.[plot]'" in out and (tmp_path / "learning_curves.csv").is_file()
    assert not list(tmp_path.glob("*.png"))


def test_without_matplotlib_an_earlier_png_is_removed_not_kept(tmp_path, no_matplotlib):
    """A PNG left by an earlier run shows the earlier numbers: where no new one can be drawn it
    is removed (and said so), and "replacing" names only the files written over."""
    d = tmp_path
    commands = {
        "figure4": ["simulate", "--out", str(d), "--steps", "3", "--figures", "4"],
        "figure2_jacobian": ["jacobian", "--out", str(d), "--models", "lstm", "--lengths", "2",
                             "--hidden-size", "2", "--input-size", "1", "--sequences", "1"],
        "learning_curves": ["plot", str(make_run(tmp_path, "r")), "--out", str(d)],
    }
    for stem, args in commands.items():
        run_cli(args)                                  # the numbers of an earlier run, no PNG
        (d / f"{stem}.png").write_bytes(PNG_MAGIC + b"drawn from other numbers")
        out = run_cli(args)
        assert not (d / f"{stem}.png").exists(), out
        assert f"removed the earlier {d / stem}.png: it showed the numbers these replace" in out
        numbers = ([d / f"{stem}.csv"] if stem == "learning_curves" else
                   [d / f"{stem}.{e}" for e in (("json", "csv") if stem == "figure4"
                                                else ("csv", "json"))])
        assert out.rstrip().endswith(f"replacing the earlier {', '.join(map(str, numbers))}")


@pytest.mark.parametrize("args, match", [
    (["simulate", "--figures", "2"], "no simulation figure 2"),
    (["simulate", "--figures", "one"], "comma-separated int"),
    (["simulate", "--figures", "3,4", "--seed", "7"],
     "--seed is for figures 1, 5, and none of --figures 3,4 uses it; leave it out"),
    (["simulate", "--figures", "3", "--eps", "0.2"],
     "--eps is for figures 1, 4, 5, and none of --figures 3 uses it"),
    (["jacobian", "--models", "transformer"], "unknown model(s) transformer; choose from "
                                              "antisym, antisym-gated"),
    (["jacobian", "--lengths", "0"], "lengths must be >= 1"),
    (["jacobian", "--gammas", "-1"], "gammas must be >= 0"),
    (["jacobian", "--models", "lstm,gru", "--gammas", "1"],
     "--gammas is for cells with gamma, and none of lstm, gru has one"),
    (["jacobian", "--models", "rnn", "--eps", "0.5"], "--eps is for cells with eps"),
    (["jacobian", "--data-dir", "data"], "--data-dir is where --task's data is"),
])
def test_commands_reject_bad_options(tmp_path, args, match):
    result = CliRunner().invoke(cli, args + ["--out", str(tmp_path)])
    assert result.exit_code != 0 and match in result.output, result.output


def test_plot_command_reports_a_bad_run(tmp_path):
    d = make_run(tmp_path, "r", extra="oops\n")
    result = CliRunner().invoke(cli, ["plot", str(d), "--out", str(tmp_path)])
    assert result.exit_code != 0 and "line 7 is not valid JSON" in result.output


# ----------------------------------------------------------------------------------------------
# The Jacobian of trained models (checkpoints of nprnn.runs.train) and of a task's sequences
# ----------------------------------------------------------------------------------------------

def toy_task(T=5, m=2):
    from nprnn.data.datasets import ArrayTask

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, T, m)).astype("float32")
    y = (x[:, 0, 0] > 0).astype(np.int64)
    return ArrayTask("toy", x, y, x[:8], y[:8], num_classes=2)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    from nprnn.runs.train import train

    out = tmp_path_factory.mktemp("runs") / "antisym-toy"
    train(dict(model="antisym", hidden=3, iterations=6, batch_size=8, eval_every=3,
               log_every=3, checkpoint_every=3, eps=0.5, gamma=0.1),
          out=out, task=toy_task(), progress=False, echo=lambda *a: None)
    return out


def test_open_run_rebuilds_the_trained_model(trained_run):
    from nprnn.runs.checkpoint import load_checkpoint

    model = open_run(trained_run).model
    saved = load_checkpoint(trained_run)["params"]
    assert model.dtype == np.float64 and model.hyper == dict(eps=0.5, gamma=0.1)
    for k, v in saved.items():
        np.testing.assert_array_equal(model.params[k], v.astype(np.float64))
    fresh = nprnn.make_model("antisym", 2, 3, 2, eps=0.5, gamma=0.1, dtype="float64")
    assert not np.allclose(fresh.params["W"], model.params["W"])     # trained, not initial
    assert A.checkpoint_label(model, "antisym-toy") == "antisym gamma=0.1 (antisym-toy)"


def test_distinct_names_are_the_shortest_tails_no_other_path_shares(tmp_path):
    assert A.distinct_names(["runs/a", "runs/b"]) == ["a", "b"]
    assert A.distinct_names(["runs/a/run", "runs/b/run", "other"]) == [
        os.path.join("a", "run"), os.path.join("b", "run"), "other"]
    assert A.distinct_names(["x/run", "x/y/run/"]) == [os.path.join("x", "run"),
                                                       os.path.join("y", "run")]
    with pytest.raises(ValueError, match="runs/a/ is given twice"):
        A.distinct_names(["runs/a", "runs/a/"])


def test_two_checkpoints_of_one_folder_name_are_two_lines(tmp_path, trained_run):
    """runs/1/run and runs/2/run: labels that tell them apart, so the figure and the table keep
    them apart (it groups rows by label)."""
    copies = [shutil.copytree(trained_run, tmp_path / k / "run") for k in ("1", "2")]
    out = run_cli(["jacobian", "--out", str(tmp_path / "fig"), "--checkpoint", str(copies[0]),
                   "--checkpoint", str(copies[1]), "--lengths", "4", "--sequences", "2"])
    for k in ("1", "2"):
        assert f"antisym gamma=0.1 ({os.path.join(k, 'run')})" in out


def test_jacobian_command_with_a_checkpoint(tmp_path, trained_run):
    out = run_cli(["jacobian", "--out", str(tmp_path), "--checkpoint", str(trained_run),
                   "--lengths", "4", "--sequences", "2"])
    assert "antisym gamma=0.1 (antisym-toy)" in out
    row = json.loads((tmp_path / "figure2_jacobian.json").read_text())["rows"][0]
    model = open_run(trained_run).model
    xs = A.gaussian_sequences(2, 4, 2, seed=[0, 4])
    mags = A.eigenvalue_magnitudes(model, xs)
    assert row["mean"] == pytest.approx(mags.mean(), rel=1e-12)
    result = CliRunner().invoke(cli, ["jacobian", "--out", str(tmp_path), "--checkpoint",
                                      str(trained_run), "--hidden-size", "4"])
    assert result.exit_code != 0 and "leave out --hidden-size" in result.output


def test_jacobian_command_with_a_task(tmp_path, monkeypatch):
    """--task reads sequences through nprnn.data.datasets.get_task(name, T=T, data_dir=...)."""
    import nprnn.data.datasets

    asked = []

    def get_task(name, T=None, data_dir=None, **kw):
        asked.append((name, T, data_dir))
        return toy_task(T=T, m=3)

    monkeypatch.setattr(nprnn.data.datasets, "get_task", get_task, raising=False)
    run_cli(["jacobian", "--out", str(tmp_path), "--task", "toy", "--models", "lstm",
             "--lengths", "2,3", "--hidden-size", "2", "--sequences", "3"])
    assert asked == [("toy", 2, None), ("toy", 3, None)]
    saved = json.loads((tmp_path / "figure2_jacobian.json").read_text())
    assert saved["input_size"] == 3 and [r["T"] for r in saved["rows"]] == [2, 3]
    model = nprnn.make_model("lstm", 3, 2, 2, dtype="float64")
    task = toy_task(T=3, m=3)
    xs = A.task_sequences(task, 3)                    # drawn by seed 0, the command's default
    np.testing.assert_array_equal(xs, task._x["test"][task.order("test", 0, 0, shuffle=True)[:3]])
    assert not np.array_equal(xs, task._x["test"][:3])
    assert saved["rows"][1]["mean"] == pytest.approx(
        A.eigenvalue_magnitudes(model, xs).mean(), rel=1e-12)


def test_jacobian_refuses_a_task_that_does_not_fit_the_checkpoint(tmp_path, trained_run,
                                                                 monkeypatch):
    import nprnn.data.datasets
    monkeypatch.setattr(nprnn.data.datasets, "get_task",
                        lambda name, T=None, data_dir=None, **kw: toy_task(T=T, m=3),
                        raising=False)
    result = CliRunner().invoke(cli, ["jacobian", "--out", str(tmp_path), "--checkpoint",
                                      str(trained_run), "--task", "toy", "--lengths", "2"])
    assert result.exit_code == 1 and result.exc_info[0] is SystemExit
    assert (f"task 'toy' has input size m=3, but checkpoint {trained_run} is a model of input "
            f"size m=2") in result.output


def test_jacobian_feeds_a_checkpoint_the_permutation_it_was_trained_on(tmp_path, monkeypatch):
    """--task pmnist with --checkpoint reads the permutation (perm_seed), the pixel scaling and
    the data folder the run recorded, not permutation 0 and the default folder; --data-dir still
    picks the folder. Checkpoints trained on different permutations or scalings are refused:
    every model sees one input."""
    import fake_data
    import nprnn.data.datasets
    from nprnn.data import sources
    from nprnn.data.datasets import get_task
    from nprnn.runs.train import train

    data = tmp_path / "data"
    arrays = fake_data.write_fake_mnist(data / "mnist")
    monkeypatch.setitem(sources.SOURCES, "mnist", fake_data.fake_idx_source(data, arrays=arrays))
    runs = {}
    for key, perm_seed, pixels in ((5, 5, "unit"), (0, 0, "unit"), ("z", 5, "standardised")):
        runs[key] = tmp_path / "runs" / f"perm{perm_seed}-{pixels}"
        train(dict(model="antisym", task="pmnist", perm_seed=perm_seed, hidden=2, iterations=1,
                   batch_size=4, eval_every=1, log_every=1, data_dir=str(data), pixels=pixels),
              out=runs[key], progress=False, echo=lambda *a: None)
    asked = []

    def recording(name, **kw):
        asked.append((name, kw.get("seed"), str(kw.get("data_dir")), kw.get("pixels")))
        return get_task(name, **kw)
    monkeypatch.setattr(nprnn.data.datasets, "get_task", recording)
    monkeypatch.chdir(tmp_path / "runs")               # the default folder ./data is not there
    args = ["jacobian", "--out", str(tmp_path / "fig"), "--task", "pmnist", "--lengths", "784",
            "--sequences", "2"]
    run_cli(args + ["--checkpoint", str(runs[5])])
    assert asked == [("pmnist", 5, str(data.resolve()), "unit")]
    saved = json.loads((tmp_path / "fig" / "figure2_jacobian.json").read_text())
    assert saved["inputs"] == "test sequences of task 'pmnist' (permutation seed 5), drawn by seed"
    model = open_run(runs[5]).model
    with get_task("pmnist", data_dir=data, seed=5) as task:
        xs = A.task_sequences(task, 2)
    assert saved["rows"][0]["mean"] == pytest.approx(A.eigenvalue_magnitudes(model, xs).mean(),
                                                     rel=1e-12)
    other = tmp_path / "other"
    shutil.copytree(data, other)
    run_cli(args + ["--checkpoint", str(runs[5]), "--data-dir", str(other)])
    assert asked[-1] == ("pmnist", 5, str(other), "unit")
    run_cli(args + ["--checkpoint", str(runs["z"])])
    assert asked[-1] == ("pmnist", 5, str(data.resolve()), "standardised")
    result = CliRunner().invoke(cli, args + ["--checkpoint", str(runs[5]), "--checkpoint",
                                             str(runs[0])])
    assert result.exit_code == 1 and (
        f"the checkpoints see different permutations of task 'pmnist' ({runs[5]}: perm seed 5, "
        f"{runs[0]}: perm seed 0); compare models of one permutation at a time") in result.output
    result = CliRunner().invoke(cli, args + ["--checkpoint", str(runs[5]), "--checkpoint",
                                             str(runs["z"])])
    assert result.exit_code == 1 and (
        f"trained on differently scaled pixels ({runs[5]}: unit, {runs['z']}: standardised)"
        in result.output)


# ----------------------------------------------------------------------------------------------
# The gates of trained models (`gates`)
# ----------------------------------------------------------------------------------------------

GATED = ["antisym-gated", "ablation", "antisym-xgate", "lstm", "peephole-lstm", "gru", "lem"]


def oracle_gates(model, x):
    """{gate: (T, B, n)} from the float64 NumPy oracle's forward pass (nprnn/core/reference.py)."""
    _, cache = model.cell.reference_forward(model.cell_params(), x, **model.hyper)
    if model.name == "lem":                               # y's and z's gates per step
        return {g: np.stack([s[k] for s in cache["steps"]]) for k, g in ((0, "y_gate"),
                                                                        (1, "z_gate"))}
    if "zs" in cache:                                     # the Euler cells: z_t of eq. 13
        return {"z": np.stack(cache["zs"])}
    if "gates" in cache:                                  # the LSTMs: (i, f, g, o) per step
        return {g: np.stack([s[k] for s in cache["gates"]]) for k, g in ((0, "i"), (1, "f"),
                                                                        (3, "o"))}
    return {g: np.stack([s[k] for s in cache["steps"]]) for k, g in ((0, "r"), (1, "z"))}


def test_the_cells_with_gates():
    assert [name for name, cell in nprnn.CELLS.items() if cell.sigmoid_gates] == GATED


@pytest.mark.parametrize("name", GATED)
def test_gate_statistics_pool_the_oracles_gates_over_batches_and_units(name):
    model = tiny_model(name)
    rng = np.random.default_rng(5)
    for v in model.params.values():
        if v.ndim == 1:                                   # biases and peepholes off zero too
            v += 0.5 * rng.standard_normal(v.shape)
    batches = [rng.standard_normal((3, 4, 2)), rng.standard_normal((2, 4, 2))]
    stats, S = A.gate_statistics(model, iter(batches))
    want = oracle_gates(model, np.concatenate(batches))  # (T, 5, n): pooled over both batches
    assert S == 5 and list(stats) == list(model.cell.sigmoid_gates) == list(want)
    for g, v in want.items():
        np.testing.assert_allclose(stats[g]["mean"], v.mean(axis=(1, 2)), rtol=1e-12)
        np.testing.assert_allclose(stats[g]["std"], v.std(axis=(1, 2)), rtol=1e-10)
        assert np.ptp(stats[g]["mean"]) > 0 and stats[g]["std"].min() > 0   # not constant


def test_gate_segments_pool_the_image_steps_and_the_noise_steps():
    v = np.random.default_rng(0).random((6, 20))                # (T, values of one step)
    stats = {"z": dict(mean=v.mean(axis=1), std=v.std(axis=1))}
    image, noise = A.gate_segments(stats, image_steps=2)
    assert (image["first"], image["last"], noise["first"], noise["last"]) == (1, 2, 3, 6)
    for seg, part in ((image, v[:2]), (noise, v[2:])):
        assert seg["mean"] == pytest.approx(part.mean(), rel=1e-12)
        assert seg["std"] == pytest.approx(part.std(), rel=1e-10)
    (whole,) = A.gate_segments(stats, image_steps=6)           # no noise: one segment
    assert (whole["first"], whole["last"]) == (1, 6)
    with pytest.raises(ValueError, match="image_steps must be in 1..T = 6, got 7"):
        A.gate_segments(stats, image_steps=7)


def test_gate_statistics_reject_models_without_gates_and_bad_batches():
    with pytest.raises(ValueError, match="model 'antisym', which has no gates; the models with "
                                         "gates are antisym-gated, ablation, antisym-xgate, "
                                         "lstm"):
        A.gate_statistics(tiny_model("antisym"), [np.zeros((1, 3, 2))])
    model = tiny_model("gru")
    with pytest.raises(ValueError, match=r"shape \(B, 3, 2\); got \(1, 4, 2\)"):
        A.gate_statistics(model, [np.zeros((1, 3, 2)), np.zeros((1, 4, 2))])
    with pytest.raises(ValueError, match=r"shape \(B, T, 2\); got \(1, 3, 5\)"):
        A.gate_statistics(model, [np.zeros((1, 3, 5))])
    with pytest.raises(ValueError, match="no sequences"):
        A.gate_statistics(model, [])


@pytest.fixture
def gated_noise_run(tmp_path, monkeypatch):
    """antisym-gated trained for a few steps on mnist-noise at T = 30 (28 rows, 2 noise steps),
    on fake MNIST (tests/fake_data.py: 60 training and 20 test digits)."""
    import fake_data
    from nprnn.data import sources
    from nprnn.runs.train import train

    arrays = fake_data.write_fake_mnist(tmp_path / "data" / "mnist")
    monkeypatch.setitem(sources.SOURCES, "mnist",
                        fake_data.fake_idx_source(tmp_path / "data", arrays=arrays))
    out = tmp_path / "runs" / "gated"
    train(dict(model="antisym-gated", task="mnist-noise", T=30, hidden=3, iterations=4,
               batch_size=8, eval_every=4, log_every=2, eps=0.5, gamma=0.1,
               data_dir=str(tmp_path / "data")),
          out=out, progress=False, echo=lambda *a: None)
    return out


def test_gates_command_on_a_noise_task(tmp_path, gated_noise_run):
    from nprnn.data.datasets import get_task

    out = run_cli(["gates", str(gated_noise_run), "--out", str(tmp_path / "g"),
                   "--sequences", "7", "--batch-size", "3"])
    assert run_cli(["gates", str(gated_noise_run), "--out", str(tmp_path / "g"), "--name", "b",
                    "--sequences", "7", "--batch-size", "3"]).endswith(
        f"wrote {tmp_path / 'g' / 'b'}.csv, {tmp_path / 'g' / 'b'}.json\n")
    saved = json.loads((tmp_path / "g" / "gates.json").read_text())
    (r,) = saved["runs"]
    assert (r["task"], r["T"], r["image_steps"], r["sequences"]) == ("mnist-noise", 30, 28, 7)
    # the first 7 test digits of seed 0's order, with the test noise, as `evaluate` sees them
    model = open_run(gated_noise_run, dtype=None).model
    assert model.dtype == np.float32                  # the dtype it was trained in
    with get_task("mnist-noise", data_dir=tmp_path / "data", T=30) as task:
        x, _ = next(task.batches("test", 7, seed=0, shuffle=True))
    stats, _ = A.gate_statistics(model, [x])
    np.testing.assert_allclose(r["steps"]["z"]["mean"], stats["z"]["mean"], rtol=1e-6)
    segments = A.gate_segments(stats, 28)
    assert [(s["first"], s["last"]) for s in r["segments"]] == [(1, 28), (29, 30)]
    assert r["segments"][1]["mean"] == pytest.approx(segments[1]["mean"], rel=1e-6)
    label = "antisym-gated gamma=0.1 (gated)"
    assert f"[1/1] {label}" in out                    # stderr: which run is being measured
    assert f"{label}  mnist-noise T=30  z     29-30" in out
    lines = (tmp_path / "g" / "gates.csv").read_text().splitlines()
    assert lines[0] == "label,model,task,T,gate,step,mean,std" and len(lines) == 1 + 30
    if is_png(tmp_path / "g" / "gates.png"):
        assert "wrote" in out and "gates.png" in out
    else:
        assert "pip install -e '.[plot]'" in out
    assert "note:" not in out
    # more sequences than the test split holds: all of them, and the table's reader is told
    out = run_cli(["gates", str(gated_noise_run), "--out", str(tmp_path / "g"), "--name", "all",
                   "--sequences", "25", "--batch-size", "7"])
    assert (f"note: {label}: mnist-noise has 20 test sequences, fewer than --sequences 25; all "
            f"of them were used") in out
    assert json.loads((tmp_path / "g" / "all.json").read_text())["runs"][0]["sequences"] == 20


def test_gates_command_refuses_what_it_cannot_measure(tmp_path, trained_run, gated_noise_run):
    result = CliRunner().invoke(cli, ["gates", str(gated_noise_run), str(trained_run), "--out",
                                      str(tmp_path)])
    assert result.exit_code == 1 and (f"{trained_run} holds a model 'antisym', which has no "
                                      f"gates") in result.output
    assert "[1/" not in result.output                 # said before any work
    result = CliRunner().invoke(cli, ["gates", str(gated_noise_run), "--out", str(tmp_path),
                                      "--task", "mnist"])
    assert result.exit_code == 1 and (f"task 'mnist' has input size m=1, but {gated_noise_run} "
                                      f"is a model of input size m=28") in result.output
    assert not (tmp_path / "data" / "mnist.h5").exists()     # said before building its cache


def _same_numbers(a, b, where="", rtol=1e-9):
    """JSON values a, b equal in structure and text, and in numbers to rtol (libm's last bits
    may differ between machines). Returns the first difference as a message, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(a.keys() ^ b.keys())} in one only"
        return next((d for k in a if (d := _same_numbers(a[k], b[k], f"{where}.{k}", rtol))),
                    None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items against {len(b)}"
        return next((d for i, (u, v) in enumerate(zip(a, b))
                     if (d := _same_numbers(u, v, f"{where}[{i}]", rtol))), None)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return None if np.isclose(a, b, rtol=rtol, atol=1e-12) else f"{where}: {a} against {b}"
    return None if a == b else f"{where}: {a!r} against {b!r}"


@pytest.mark.parametrize("number", A.SIMULATION_FIGURES)
def test_the_figures_in_docs_are_what_simulate_writes_now(tmp_path, number):
    """docs/figureN.json and .csv, committed, against the same figure computed now with the
    settings the JSON records: a change to the simulations or to what `simulate` writes must come
    with the figures regenerated (docs/README.md gives the command)."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    committed = json.loads((docs / f"figure{number}.json").read_text())
    panels, summary = A.simulation_summary(number, committed["steps"], committed["eps"],
                                           committed["seed"])
    A.write_json(tmp_path / "now.json", summary)
    now = json.loads((tmp_path / "now.json").read_text())
    difference = _same_numbers(now, committed, f"figure{number}.json")
    assert difference is None, difference + (f"; regenerate with `python cli.py simulate --out "
                                             f"docs --figures {number}`")
    with open(docs / f"figure{number}.csv") as f:
        header, *lines = [line.rstrip("\n").split(",") for line in f]
    rows = A.panels_to_rows(f"figure{number}", panels)
    assert header == list(rows[0]) and len(lines) == len(rows)
    assert [r[:4] for r in lines] == [[str(v) for v in list(r.values())[:4]] for r in rows]
    np.testing.assert_allclose(np.array([r[4:] for r in lines], dtype=float),
                               [list(r.values())[4:] for r in rows], rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# The critical criterion along trajectories: max Re lambda((dh_t/dh_{t-1} - I) / eps)
# ----------------------------------------------------------------------------------------------

def oracle_ode_real_parts(model, x, gated, gate_reads_h=True):
    """max Re lambda(diag(d_t) A) at every step from h_0 = 0, by eq. (12)/(13) written out:
    d = tanh'(a), or z tanh'(a) + tanh(a) z (1 - z) with the gate (the second term only where
    the gate reads A h_{t-1}: not antisym-xgate's)."""
    p, (eps, gamma) = model.params, (model.hyper["eps"], model.hyper["gamma"])
    A_mat = p["W"] - p["W"].T - gamma * np.eye(len(p["W"]))
    h, tops = np.zeros(len(A_mat)), []
    for xt in x:
        a = A_mat @ h + p["V_h"] @ xt + p["b_h"]
        zp = p["V_z"] @ xt + p["b_z"] + (A_mat @ h if gate_reads_h else 0) if gated else 0
        z = 1 / (1 + np.exp(-zp)) if gated else 1.0
        d = z * (1 - np.tanh(a) ** 2) + (np.tanh(a) * z * (1 - z) if gated and gate_reads_h
                                         else 0)
        tops.append(np.linalg.eigvals(d[:, None] * A_mat).real.max())
        h = h + eps * z * np.tanh(a)
    return np.array(tops)


@pytest.mark.parametrize("name", ["antisym", "antisym-gated", "antisym-xgate"])
def test_ode_jacobian_real_parts_are_the_formula(name):
    model = nprnn.make_model(name, 2, 5, 2, eps=0.3, gamma=0.05, sigma_w=2, seed=4,
                             dtype="float64")
    x = np.random.default_rng(5).standard_normal((7, 2))
    np.testing.assert_allclose(A.ode_jacobian_real_parts(model, x),
                               oracle_ode_real_parts(model, x, name != "antisym",
                                                     name != "antisym-xgate"),
                               rtol=1e-9, atol=1e-12)


def test_the_gate_breaks_the_criterion_where_tanh_saturates_below_zero():
    """With tanh(a) near -1 the gate's term makes d < 0: eq. (13)'s L_t gets eigenvalues with
    positive real parts, where eq. (12)'s and antisym-xgate's stay in [-gamma, 0]."""
    x = np.random.default_rng(6).standard_normal((3, 4, 2))
    tops = {}
    for name in ("antisym", "antisym-gated", "antisym-xgate"):
        model = nprnn.make_model(name, 2, 6, 2, eps=0.1, gamma=0.05, sigma_w=2, seed=7,
                                 dtype="float64")
        model.params["b_h"][:] = -3.0
        calls = []
        rows = A.ode_jacobian_spectra([(name, model)], x, segments=2,
                                      progress=lambda *a: calls.append(a))
        assert [(r["first"], r["last"], r["sequences"]) for r in rows] == [(1, 2, 3), (3, 4, 3)]
        assert calls == [(1, 3), (2, 3), (3, 3)]
        tops[name] = rows
    assert all(-0.05 - 1e-12 <= r["mean"] and r["max"] <= 1e-12 and r["share_growing"] == 0
               for name in ("antisym", "antisym-xgate") for r in tops[name])
    assert all(r["max"] > 0.01 and r["share_growing"] == 1 for r in tops["antisym-gated"])


def test_ode_jacobian_rejects_cells_without_eps_and_bad_segments():
    x = np.zeros((1, 3, 2))
    with pytest.raises(ValueError, match="model 'lstm' has no step size eps.*antisym, "
                                         "antisym-gated, ablation, feedback"):
        A.ode_jacobian_spectra([("l", tiny_model("lstm"))], x, 1)
    with pytest.raises(ValueError, match="segments must be between 1 and T = 3, got 4"):
        A.ode_jacobian_spectra([("a", tiny_model("antisym"))], x, 4)


def test_criticality_command(tmp_path, gated_noise_run):
    from nprnn.data.datasets import get_task

    out = run_cli(["criticality", str(gated_noise_run), "--sequences", "3", "--segments", "2"])
    label = "antisym-gated gamma=0.1 (gated)"
    assert f"[1/1] {label}" in out                    # stderr: which run is being measured
    model = open_run(gated_noise_run).model
    with get_task("mnist-noise", data_dir=tmp_path / "data", T=30) as task:
        x, _ = next(task.batches("test", 3, seed=0, shuffle=True))
    expected = A.ode_jacobian_spectra([(label, model)], x, 2)
    for r, steps in zip(expected, ("1-15", "16-30")):
        assert (f"{label}  mnist-noise  {steps}" in out and f"{r['mean']:.3g}" in out
                and f"{r['max']:.3g}" in out)
    toy = tmp_path / "rnn-toy"
    from nprnn.runs.train import train
    train(dict(model="rnn", hidden=3, iterations=1, batch_size=8, eval_every=1),
          out=toy, task=toy_task(), progress=False, echo=lambda *a: None)
    result = CliRunner().invoke(cli, ["criticality", str(gated_noise_run), str(toy)])
    assert result.exit_code == 1 and (f"{toy} is a rnn model, not an Euler cell: the criterion "
                                      f"is for antisym, antisym-gated, ablation, "
                                      f"feedback") in result.output
    assert "[1/" not in result.output                 # said before any work
    result = CliRunner().invoke(cli, ["criticality", str(gated_noise_run), "--task", "mnist"])
    assert result.exit_code == 1 and (f"task 'mnist' has input size m=1, but {gated_noise_run} "
                                      f"is a model of input size m=28") in result.output
    assert "[1/" not in result.output
    out = run_cli(["criticality", str(gated_noise_run), "--sequences", "25", "--segments", "1"])
    assert (f"note: {label}: mnist-noise has 20 test sequences, fewer than --sequences 25; all "
            f"of them were used") in out
