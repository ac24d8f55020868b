"""All of nprnn's matplotlib code: the pictures of the numbers that `nprnn/study/analysis.py` computes.

matplotlib is an optional extra (`pip install -e .[plot]`). Nothing else in nprnn imports this
module at import time; each function here imports matplotlib when called and raises
`PlotUnavailable` (an ImportError) with the install hint if it is missing, so the commands can
still write their numbers and say how to get the pictures.

Figures are drawn on `matplotlib.figure.Figure` objects directly (no pyplot, no global state, no
display needed) and saved as PNG.
"""
import numpy as np

from .analysis import EVAL_SPLITS, curve, vector_field
from ..util.files import written_atomically

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


# the captions and titles of nprnn/study/analysis.py (plain text, as the terminal and the JSON have
# them) in matplotlib's mathtext, for the figures: the paper's symbols
MATHTEXT = (("h_(t-1)", r"$h_{t-1}$"), ("h_t", r"$h_t$"), ("x_t", r"$x_t$"),
            ("N(0, I)", r"$\mathcal{N}(0, I)$"), ("N(0, 1)", r"$\mathcal{N}(0, 1)$"),
            ("W_ij", r"$W_{ij}$"), ("U_12", r"$U_{12}$"), ("U - U^T", r"$U - U^T$"),
            ("Wdiff", r"$W_{\mathrm{diff}}$"), ("W+", r"$W_+$"), ("W-", r"$W_-$"),
            ("W0", r"$W_0$"), ("+-", r"$\pm$"), ("eps =", r"$\epsilon$ ="),
            ("gamma=", r"$\gamma$ = "), ("lambda", r"$\lambda$"), ("tanh", r"$\tanh$"),
            ("dh_T / dh_0", r"$\partial h_T / \partial h_0$"),
            ("dh_T/dh_0", r"$\partial h_T / \partial h_0$"))


def mathtext(text):
    """`text` with the symbols of MATHTEXT set as mathtext."""
    for plain, math in MATHTEXT:
        text = text.replace(plain, math)
    return text


def draw_panel(ax, panel, field=True, xlabel=True, ylabel=True):
    """One simulation panel: each trajectory as points whose opacity grows with t (earlier steps
    more translucent, as in the paper), its initial state as a star, and on feedback panels the
    ODE's vector field h' = tanh(W h) in grey; the axes are the state's two coordinates."""

    hs = panel["states"]                       # (T+1, S, 2)
    xlim, ylim = _limits(panel)
    if field and panel["kind"] == "feedback":
        X, Y, U, V = vector_field(panel["W"], xlim, ylim, num=FIELD_GRID)
        # arrow length proportional to |h'|, the longest one 0.9 grid spacings
        spacing = (xlim[1] - xlim[0]) / (FIELD_GRID - 1)
        longest = max(float(np.hypot(U, V).max()), 1e-12)
        ax.quiver(X, Y, U, V, color="0.7", angles="xy", scale_units="xy",
                  scale=longest / (0.9 * spacing), width=0.004)
    alpha = np.linspace(0.08, 1.0, hs.shape[0] - 1)
    for s in range(hs.shape[1]):
        color = TRAJECTORY_COLORS[s % len(TRAJECTORY_COLORS)]
        ax.scatter(hs[1:, s, 0], hs[1:, s, 1], s=10, c=_rgba(color, alpha), linewidths=0)
        ax.plot(hs[0, s, 0], hs[0, s, 1], marker="*", markersize=12, color=color,
                markeredgecolor="black", markeredgewidth=0.6, linestyle="none")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.tick_params(labelsize=8)
    if xlabel:
        ax.set_xlabel(r"$h_1$", fontsize=10)
    if ylabel:
        ax.set_ylabel(r"$h_2$", fontsize=10)
    ax.set_title(mathtext(panel["title"]), fontsize=10)


def _simulation_legend(fig, panels):
    """The marks of every panel explained once, below the grid: the stars, the fade of time and,
    where a panel is a feedback one, the grey vector field."""
    from matplotlib.lines import Line2D
    handles = [
        Line2D([], [], marker="*", markersize=12, color="0.5", markeredgecolor="black",
               markeredgewidth=0.6, linestyle="none", label=r"initial state $h_0$ (one colour "
                                                              r"per trajectory)"),
        Line2D([], [], marker="o", markersize=5, color="0.75", linestyle="none",
               label=r"$h_1$ (faint) ... $h_T$ (solid): later steps are more opaque")]
    if any(p["kind"] == "feedback" for p in panels):
        handles.append(Line2D([], [], marker=r"$\rightarrow$", markersize=14, color="0.6",
                              linestyle="none", label=r"vector field of the ODE "
                                                      r"$h' = \tanh(W h)$"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9,
               frameon=False)


def plot_simulation(panels, path, ncols, title=""):
    """A grid of simulation panels (Figures 1, 3, 4, 5) saved as a PNG at `path`: axes labelled
    on the outer panels, one legend for the whole figure, the caption in mathtext."""
    nrows = -(-len(panels) // ncols)
    fig = _figure(figsize=(3.3 * ncols, 3.3 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, (ax, panel) in enumerate(zip(axes.ravel(), panels)):
        row, col = divmod(k, ncols)
        draw_panel(ax, panel, xlabel=row == nrows - 1 or k + ncols >= len(panels),
                   ylabel=col == 0)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(mathtext(title), fontsize=12)
    _simulation_legend(fig, panels)
    _save(fig, path, dpi=150)


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")


def plot_jacobian(rows, path, title=""):
    """Figure 2: mean and standard deviation of |lambda(dh_T/dh_0)| against T, one line per model
    label, each with a marker of its own, every panel with the legend: the mean on a log axis (it
    spans many decades when gradients vanish), with the level 1 marked; the models that keep the
    mean near 1 again on a linear axis, where they can be told apart; the standard deviation."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    near_one = [label for label in labels
                if all(r["mean"] >= 0.5 for r in rows if r["label"] == label)]
    fig = _figure(figsize=(17 if near_one else 12, 4.8), layout="constrained")
    axes = fig.subplots(1, 3 if near_one else 2)
    ax_mean, ax_std = axes[0], axes[-1]
    ax_near = axes[1] if near_one else None
    for k, label in enumerate(labels):
        rs = sorted((r for r in rows if r["label"] == label), key=lambda r: r["T"])
        T = [r["T"] for r in rs]
        style = dict(linestyle="--" if rs[0]["model"].startswith("lstm") else "-",
                     marker=MARKERS[k % len(MARKERS)], markersize=6, color=f"C{k % 10}",
                     label=mathtext(label))
        # a mean of 0 (J is 0, or its eigenvalues rounded to 0) has no place on the log axis
        shown = [r for r in rs if r["mean"] > 0]
        ax_mean.plot([r["T"] for r in shown], [r["mean"] for r in shown], **style)
        if label in near_one:
            ax_near.plot(T, [r["mean"] for r in rs], **style)
        ax_std.plot(T, [r["std"] for r in rs], **style)
    ax_mean.set_yscale("log")
    ylabel = r"$|\lambda(\partial h_T / \partial h_0)|$"
    panels = [(ax_mean, "mean of " + ylabel + " (log axis)"),
              (ax_std, "standard deviation of " + ylabel)]
    if near_one:
        panels.insert(1, (ax_near, "mean of " + ylabel + r", near 1"))
    for ax, what in panels:
        if ax is not ax_std:
            ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle=":", label=r"$|\lambda| = 1$")
        ax.set_xlabel(r"sequence length $T$ (steps)", fontsize=11)
        ax.set_ylabel(what, fontsize=11)
        ax.set_xticks(sorted({r["T"] for r in rows}))
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(mathtext(title), fontsize=12)
    _save(fig, path, dpi=150)


# the evaluation splits' markers in learning curves: a run with --valid-size has both
SPLIT_MARKERS = {"valid": "^", "test": "o"}


def run_colors(count):
    """`count` distinct colours: matplotlib's ten-colour cycle, or, for more runs than that
    (where the cycle would repeat), evenly spaced along the turbo colour map."""
    if count <= 10:
        return [f"C{k}" for k in range(count)]
    from matplotlib import colormaps
    return [colormaps["turbo"](k / (count - 1)) for k in range(count)]


def _plain_log_ticks(ax):
    """Tick labels of a log axis as plain numbers (4, 0.3), not 4x10^0; between the decades
    only where the axis spans about one (matplotlib's choice, which keeps them apart)."""
    from matplotlib.ticker import FuncFormatter, LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def plot_learning_curves(runs, path, title=""):
    """Loss (log axis, so a diverging run does not flatten the others) and accuracy against
    iterations: training as a line, evaluations as markers joined by a dashed line, told apart
    by colour too (one run: blue for training, orange and green for the evaluation splits;
    several: one colour per run, labelled by model and task, in one legend beside the panels
    that names each run once and each mark once). The accuracy axis spans the data, so that 0.90
    and 0.97 are told apart; runs scored by their MSE (adding) have no accuracy panel, and a
    dotted line marks the loss of a model without memory where the task has one."""

    has_accuracy = any(len(curve(run, split, "accuracy")[0])
                       for run in runs for split in ("train",) + EVAL_SPLITS)
    one = len(runs) == 1
    width = (12 if has_accuracy else 6.5) + (0 if one else 3.5)     # several: the legend beside
    fig = _figure(figsize=(width, 4.8), layout="constrained")
    axes = fig.subplots(1, 2 if has_accuracy else 1, sharex=True)
    ax_loss, ax_acc = axes if has_accuracy else (axes, None)
    split_colors = {"train": "C0", "test": "C1", "valid": "C2"}
    lows, highs = [], []
    for run, color in zip(runs, run_colors(len(runs))):
        name = "" if one else f"{run['label']}, "
        for split in ("train",) + EVAL_SPLITS:
            c = split_colors[split] if one else color
            style = (dict(linewidth=1.2, alpha=0.8) if split == "train" else
                     dict(linestyle="--", marker=SPLIT_MARKERS[split], markersize=5))
            for ax, key in ((ax_loss, "loss"), (ax_acc, "accuracy")):
                it, v = curve(run, split, key)
                if len(it):
                    ax.plot(it, v, color=c, label=f"{name}{split}", **style)
                    if key == "accuracy":          # past the first tenth of the run
                        late = v[it >= 0.1 * it.max()]
                        lows.append(float(late.min()))
                        highs.append(float(late.max()))
        baseline = (run["config"].get("baseline") or {}).get("loss")
        if baseline is not None:
            ax_loss.axhline(baseline, color="0.4" if one else color, linestyle=":",
                            linewidth=1.2, label=f"{name}without memory")
    losses = {run["config"].get("loss", "xent") for run in runs}
    ax_loss.set_ylabel({"xent": "cross-entropy loss", "mse": "mean squared error"}.get(
        losses.pop() if len(losses) == 1 else None, "loss (cross-entropy or MSE)"), fontsize=11)
    ax_loss.set_yscale("log")
    _plain_log_ticks(ax_loss)
    if ax_acc is not None:
        ax_acc.set_ylabel("accuracy", fontsize=11)
    if lows:
        ax_acc.set_ylim(max(0.0, min(lows) - 0.03), min(1.0, max(highs) + 0.02))
    for ax in (ax_loss, ax_acc)[:1 + has_accuracy]:
        ax.set_xlabel("iteration", fontsize=11)
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
        if one and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not one:
        _runs_legend(fig, runs, ax_loss)
    fig.suptitle(title or (runs[0]["label"] if one else "learning curves"), fontsize=12)
    _save(fig, path, dpi=150)


def _runs_legend(fig, runs, ax_loss):
    """One legend beside the panels of several runs: each run's colour once, then each mark
    once (the training line, the evaluation splits' markers, the line without memory)."""
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=c, linewidth=2.5, label=run["label"])
               for run, c in zip(runs, run_colors(len(runs)))]
    drawn = {line.get_label().rsplit(", ", 1)[-1] for line in ax_loss.get_lines()}
    marks = [("train", dict(linewidth=1.2))] + [
        (split, dict(linestyle="--", marker=SPLIT_MARKERS[split], markersize=5))
        for split in EVAL_SPLITS] + [("without memory", dict(linestyle=":", linewidth=1.2))]
    handles += [Line2D([], [], color="0.35", label=mark, **style) for mark, style in marks
                if mark in drawn]
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)


def plot_gates(runs, path):
    """Each run's gates against the step t: the mean over sequences and units as a line, one
    standard deviation either side as a thin dotted line of the same colour (filled bands
    overlapped into one), and a vertical line where the image ends and noise begins; the legend
    sits beside the panel, off the data."""
    fig = _figure(figsize=(12, 3.0 * len(runs) + 0.6), layout="constrained")
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, run in zip(axes, runs):
        t = np.arange(1, run["T"] + 1)
        for k, (gate, s) in enumerate(run["steps"].items()):
            mean, std = np.asarray(s["mean"]), np.asarray(s["std"])
            ax.plot(t, mean, color=f"C{k}", linewidth=1.6, label=f"${gate}_t$ mean")
            ax.plot(t, mean + std, color=f"C{k}", linewidth=0.7, linestyle=":",
                    label=f"${gate}_t$ mean $\\pm$ 1 std")
            ax.plot(t, mean - std, color=f"C{k}", linewidth=0.7, linestyle=":")
        if run["image_steps"] < run["T"]:
            ax.axvline(run["image_steps"] + 0.5, color="0.3", linestyle="-.", linewidth=1,
                       label="image ends, noise begins")
        ax.set_ylim(-0.02, 1.02)            # a gate held at 0 or 1 stays in sight
        ax.set_xlim(1, max(run["T"], 2))
        ax.set_ylabel("gate value", fontsize=11)
        ax.tick_params(labelsize=9)
        ax.set_title(f"{mathtext(run['label'])} on {run['task']}, T = {run['T']}: over "
                     f"{run['sequences']} test sequences and all units", fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel(r"step $t$", fontsize=11)
    _save(fig, path, dpi=150)


SWEEP_LABELS = {"sigma_w": r"$\sigma_w$", "eps": r"$\epsilon$", "gamma": r"$\gamma$",
                "lr": "learning rate"}
SWEEP_STYLES = {"complete": dict(marker="o", color="C0", label="complete"),
                "pruned": dict(marker="o", facecolors="none", edgecolors="C1",
                               label="pruned (value when stopped)"),
                "running": dict(marker="^", facecolors="none", edgecolors="C2",
                                label="running (best so far)"),
                "paused": dict(marker=">", facecolors="none", edgecolors="C4",
                               label="paused at a rung (best so far)"),
                "stopped": dict(marker="v", facecolors="none", edgecolors="C3",
                                label="stopped, to resume (best so far)")}


def plot_sweep(rows, space, path, title=""):
    """A sweep's best validation accuracy against each searched hyperparameter, a panel each:
    one marker per trial (complete, pruned, running, paused, stopped; the chosen trial starred;
    those without an accuracy counted in the title). `space`: {name: its grid values, or
    (low, high, log) for a range}; each axis spans the whole space,
    ticked at the grid's values. Numbers spanning a decade or more (or a log range) are on a
    log axis, where 0 sits at the left edge; choices are evenly spaced, and trials at one value
    jittered a little so that they stay apart."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    names = sorted(space)
    ncols = min(3, len(names))
    nrows = -(-len(names) // ncols)
    fig = _figure(figsize=(4.2 * ncols, 3.4 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    for ax in axes[len(names):]:
        ax.set_visible(False)
    scored = [r for r in rows if r["valid"] is not None]
    jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(scored))
    for ax, name in zip(axes, names):
        axis = space[name]
        ranged = isinstance(axis, tuple)
        values = list(axis[:2]) if ranged else list(axis)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        positive = [v for v in values if numeric and v > 0]
        log = (axis[2] if ranged else
               bool(positive) and max(positive) / min(positive) >= 10)
        zero_at = min(positive) / 3 if log and positive else 0.0

        def x_of(v, j):
            if not numeric:
                return values.index(v) + j
            return v if (v > 0 or not log) else zero_at
        for state, style in SWEEP_STYLES.items():
            pts = [(r, j) for r, j in zip(scored, jitter) if r["state"] == state]
            if pts:
                ax.scatter([x_of(r["params"][name], j) for r, j in pts],
                           [r["valid"] for r, _ in pts], s=28, linewidths=1.2, zorder=2,
                           **style)
        for r, j in zip(scored, jitter):
            if r.get("chosen"):
                ax.scatter([x_of(r["params"][name], j)], [r["valid"]], marker="*", s=180,
                           color="tab:red", zorder=3, label=f"chosen: trial {r['number']}")
        if log:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(values)), [str(v) for v in values])
            ax.set_xlim(-0.5, len(values) - 0.5)
        elif not ranged:
            ticks = [x_of(v, 0) for v in values]
            ax.set_xticks(ticks, [f"{v:g}" for v in values])
            ax.xaxis.set_minor_formatter(NullFormatter())
            low, high = min(ticks), max(ticks)            # the grid, a little inside the frame
            pad = (high / low) ** 0.06 if log else 0.06 * (high - low or 1)
            ax.set_xlim(*((low / pad, high * pad) if log else (low - pad, high + pad)))
        else:
            ax.set_xlim(*values)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(SWEEP_LABELS.get(name, name.replace("_", " ")), fontsize=11)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=9)
    for ax in axes[::ncols]:
        ax.set_ylabel("best validation accuracy", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=8)
    unscored = len(rows) - len(scored)
    fig.suptitle((title or "sweep") + (f" ({unscored} not drawn: failed, or not yet evaluated)"
                                       if unscored else ""), fontsize=12)
    _save(fig, path, dpi=150)
