"""All of nprnn's matplotlib code: the pictures of the numbers that `nprnn/analysis.py` computes.

matplotlib is an optional extra (`pip install -e .[plot]`). Nothing else in nprnn imports this
module at import time; each function here imports matplotlib when called and raises
`PlotUnavailable` (an ImportError) with the install hint if it is missing, so the commands can
still write their numbers and say how to get the pictures.

Figures are drawn on `matplotlib.figure.Figure` objects directly (no pyplot, no global state, no
display needed) and saved as PNG.
"""
import numpy as np

from .analysis import EVAL_SPLITS, curve, vector_field
from .files import written_atomically

INSTALL_HINT = ("matplotlib is not installed, so no PNG was drawn (the numbers were written). "
                "Install the plot extra to get the figures: pip install -e '.[plot]'")

TRAJECTORY_COLORS = ("tab:blue", "tab:orange", "tab:green")   # one per initial state
FIELD_GRID = 15                                                # vector-field arrows per side


class PlotUnavailable(ImportError):
    """matplotlib could not be imported."""


def _figure(**kwargs):
    """A matplotlib Figure, or PlotUnavailable with the install hint."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotUnavailable(f"{INSTALL_HINT} ({e})") from None
    return Figure(**kwargs)


def _save(fig, path, dpi):
    """Save `fig` as a PNG at `path` atomically (`files.written_atomically`): a run killed
    while saving leaves the earlier PNG or none, never part of one. The temporary name has no
    .png, so the format is named."""

    with written_atomically(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)


def _rgba(color, alpha):
    from matplotlib.colors import to_rgba

    r, g, b, _ = to_rgba(color)
    return np.column_stack([np.full_like(alpha, r), np.full_like(alpha, g),
                            np.full_like(alpha, b), alpha])


def _limits(panel):
    """Axis limits: the tanh box [-1.1, 1.1]^2 for vanilla panels; for feedback panels a square
    around all states, at least that box."""
    if panel["kind"] == "vanilla":
        return (-1.1, 1.1), (-1.1, 1.1)
    r = max(1.1, 1.1 * float(np.abs(panel["states"]).max()))
    return (-r, r), (-r, r)


def draw_panel(ax, panel, field=True):
    """One simulation panel: each trajectory as points whose opacity grows with t (earlier steps
    more translucent, as in the paper), its initial state as a star, and on feedback panels the
    ODE's vector field h' = tanh(W h) in grey."""

    hs = panel["states"]                       # (T+1, S, 2)
    xlim, ylim = _limits(panel)
    if field and panel["kind"] == "feedback":
        X, Y, U, V = vector_field(panel["W"], xlim, ylim, num=FIELD_GRID)
        # arrow length proportional to |h'|, the longest one 0.9 grid spacings
        spacing = (xlim[1] - xlim[0]) / (FIELD_GRID - 1)
        longest = max(float(np.hypot(U, V).max()), 1e-12)
        ax.quiver(X, Y, U, V, color="0.65", angles="xy", scale_units="xy",
                  scale=longest / (0.9 * spacing), width=0.005)
    alpha = np.linspace(0.08, 1.0, hs.shape[0] - 1)
    for s in range(hs.shape[1]):
        color = TRAJECTORY_COLORS[s % len(TRAJECTORY_COLORS)]
        ax.scatter(hs[1:, s, 0], hs[1:, s, 1], s=9, c=_rgba(color, alpha), linewidths=0)
        ax.plot(hs[0, s, 0], hs[0, s, 1], marker="*", markersize=11, color=color,
                markeredgecolor="black", markeredgewidth=0.6, linestyle="none")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.tick_params(labelsize=6)
    ax.set_title(panel["title"], fontsize=8)


def plot_simulation(panels, path, ncols, title=""):
    """A grid of simulation panels (Figures 1, 3, 4, 5) saved as a PNG at `path`."""
    nrows = -(-len(panels) // ncols)
    fig = _figure(figsize=(2.6 * ncols, 2.75 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, panel in zip(axes.ravel(), panels):
        draw_panel(ax, panel)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    _save(fig, path, dpi=110 if nrows <= 2 else 80)    # the 4x4 grids at a lower resolution


def plot_jacobian(rows, path, title=""):
    """Figure 2: mean and standard deviation of |lambda(dh_T/dh_0)| against T, one line per model
    label; the mean on a log axis (it spans many decades when gradients vanish)."""
    fig = _figure(figsize=(10, 4), layout="constrained")
    ax_mean, ax_std = fig.subplots(1, 2)
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for label in labels:
        rs = sorted((r for r in rows if r["label"] == label), key=lambda r: r["T"])
        T = [r["T"] for r in rs]
        style = "--" if rs[0]["model"].startswith("lstm") else "-"
        # a mean of 0 (J is 0, or its eigenvalues rounded to 0) has no place on the log axis
        shown = [r for r in rs if r["mean"] > 0]
        ax_mean.plot([r["T"] for r in shown], [r["mean"] for r in shown], style, marker="o",
                     label=label)
        ax_std.plot(T, [r["std"] for r in rs], style, marker="o", label=label)
    ax_mean.set_yscale("log")
    ax_mean.axhline(1.0, color="0.5", linewidth=0.8)
    for ax, what in ((ax_mean, "mean"), (ax_std, "standard deviation")):
        ax.set_xlabel("T (time steps)")
        ax.set_ylabel(f"{what} of |eigenvalue(dh_T / dh_0)|")
        ax.set_xticks(sorted({r["T"] for r in rows}))
        ax.grid(alpha=0.3)
    ax_std.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    _save(fig, path, dpi=110)


# the evaluation splits' markers in learning curves: a run with --valid-size has both
SPLIT_MARKERS = {"valid": "^", "test": "o"}


def run_colors(count):
    """`count` distinct colours: matplotlib's ten-colour cycle, or, for more runs than that
    (where the cycle would repeat), evenly spaced along the turbo colour map."""
    if count <= 10:
        return [f"C{k}" for k in range(count)]
    from matplotlib import colormaps
    return [colormaps["turbo"](k / (count - 1)) for k in range(count)]


def plot_learning_curves(runs, path, title=""):
    """Loss (train solid, evaluation dashed; log axis, so a diverging run does not flatten the
    others) and evaluation accuracy against iterations, one colour per run, labelled by model and
    task; the evaluation splits are told apart by their markers (SPLIT_MARKERS)."""

    fig = _figure(figsize=(11, 4), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2, sharex=True)
    for run, color in zip(runs, run_colors(len(runs))):
        it, loss = curve(run, "train", "loss")
        if len(it):
            ax_loss.plot(it, loss, color=color, label=f"{run['label']}, train")
        for split in EVAL_SPLITS:
            marker = SPLIT_MARKERS[split]
            it, loss = curve(run, split, "loss")
            if len(it):
                ax_loss.plot(it, loss, "--", color=color, marker=marker, markersize=4,
                             label=f"{run['label']}, {split}")
            it, acc = curve(run, split, "accuracy")
            if len(it):
                ax_acc.plot(it, acc, color=color, marker=marker, markersize=4,
                            label=f"{run['label']}, {split}")
    ax_loss.set_ylabel("cross-entropy loss")
    ax_loss.set_yscale("log")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_ylim(0, 1)
    for ax in (ax_loss, ax_acc):
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    _save(fig, path, dpi=110)


def plot_gates(runs, path):
    """Each run's gates against the step t: the mean over sequences and units, with a band of
    one standard deviation, and a dotted line where the image ends and noise begins."""
    fig = _figure(figsize=(10, 2.6 * len(runs) + 0.4), layout="constrained")
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, run in zip(axes, runs):
        for k, (gate, s) in enumerate(run["steps"].items()):
            t = np.arange(1, run["T"] + 1)
            mean, std = np.asarray(s["mean"]), np.asarray(s["std"])
            ax.plot(t, mean, color=f"C{k}", label=gate)
            ax.fill_between(t, mean - std, mean + std, color=f"C{k}", alpha=0.2, linewidth=0)
        if run["image_steps"] < run["T"]:
            ax.axvline(run["image_steps"] + 0.5, color="0.4", linestyle=":", linewidth=1,
                       label="image | noise")
        ax.set_ylim(-0.02, 1.02)            # a gate held at 0 or 1 stays in sight
        ax.set_xlim(1, max(run["T"], 2))
        ax.set_ylabel("gate value")
        ax.set_title(f"{run['label']} on {run['task']}, T={run['T']}: mean over "
                     f"{run['sequences']} test sequences and the units, +- 1 std", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("step t")
    _save(fig, path, dpi=110)
