"""nprnn's command line: a thin click group that parses options, calls into `nprnn`, and prints.

    python cli.py params                  parameter counts at the paper's configurations
    python cli.py bench --model antisym   forward / forward+backward timings (see README)
    python cli.py --help                  everything else
"""
import click

import nprnn


@click.group(context_settings=dict(help_option_names=["-h", "--help"]))
def cli():
    """AntisymmetricRNN and its baselines in NumPy + Numba (Chang et al., ICLR 2019)."""


# ----------------------------------------------------------------------------------------------
# params: Table 1 and Table 2's "# params" column
# ----------------------------------------------------------------------------------------------

# (table, model, hidden units, input size m, the paper's "# params")
PAPER_CONFIGS = [
    ("Table 1 (MNIST)", "lstm", 128, 1, "68k"),
    ("Table 1 (MNIST)", "antisym", 128, 1, "10k"),
    ("Table 1 (MNIST)", "antisym-gated", 128, 1, "10k"),
    ("Table 2 (CIFAR-10)", "lstm", 128, 3, "69k"),
    ("Table 2 (CIFAR-10)", "ablation", 196, 3, "42k"),
    ("Table 2 (CIFAR-10)", "antisym", 256, 3, "36k"),
    ("Table 2 (CIFAR-10)", "antisym-gated", 256, 3, "37k"),
]


@cli.command()
@click.option("--classes", "K", default=10, show_default=True, help="Readout classes K.")
def params(K):
    """Parameter count of each model at the paper's configurations, beside the paper's column.

    Counts include the readout (W_out, b_out); W of the antisymmetric models counts n(n-1)/2."""
    click.echo(f"{'table':<20} {'model':<15} {'units':>5} {'m':>3} {'ours':>8} {'paper':>6}")
    for table, name, n, m, paper in PAPER_CONFIGS:
        count = nprnn.CELLS[name].num_params(m, n) + K * n + K
        click.echo(f"{table:<20} {name:<15} {n:>5} {m:>3} {count:>8,} {paper:>6}")
    click.echo("\nAll models at n=128, m=1:")
    for name, cell in nprnn.CELLS.items():
        click.echo(f"  {name:<15} {cell.num_params(1, 128) + K * 128 + K:>8,}  {cell.summary}")


# ----------------------------------------------------------------------------------------------
# simulate, jacobian, plot: the paper's figures. nprnn/analysis.py computes the numbers, every
# command writes them (CSV/JSON), and nprnn/plotting.py draws the PNG when matplotlib is there.
# ----------------------------------------------------------------------------------------------

def _number_list(kind):
    """A click callback turning "a,b,c" into a list of `kind` (int or float)."""
    def parse(ctx, param, value):
        try:
            items = [kind(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"expected comma-separated {kind.__name__} values such as "
                                     f"'1,2', got {value!r}") from None
        if not items:
            raise click.BadParameter(f"expected at least one value, got {value!r}")
        return items
    return parse


def _out_dir(out):
    from pathlib import Path

    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _plot_or_hint(draw, *args, **kwargs):
    """Call nprnn.plotting.<draw>(*args); without matplotlib print how to get the PNG instead."""
    from nprnn import plotting

    try:
        getattr(plotting, draw)(*args, **kwargs)
    except plotting.PlotUnavailable as e:
        click.echo(str(e))
        return False
    return True


@cli.command()
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Folder for figureN.png/.json/.csv (created if missing).")
@click.option("--figures", default="1,3,4,5", show_default=True, callback=_number_list(int),
              help="Which of the paper's simulation figures: 1 (section 4), 3, 4, 5 (App. D).")
@click.option("--steps", default=50, show_default=True, type=click.IntRange(min=1),
              help="T, the number of steps.")
@click.option("--eps", default=0.1, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Step size of feedback panels.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of Figure 1's random matrices ((a), (c); (d) uses seed+1) and of "
                   "Figure 5's input.")
def simulate(out, figures, steps, eps, seed):
    """Section 4's two-dimensional RNNs from (0, 0.5), (-0.5, -0.5), (0.5, -0.75).

    For each figure N: figureN.json (matrices, eigenvalues, |h| at start/end/min/max per initial
    state), figureN.csv (every state h_t) and figureN.png. The choices the paper leaves open are
    stated in nprnn/analysis.py."""
    from nprnn import analysis

    bad = [f for f in figures if f not in analysis.SIMULATION_FIGURES]
    if bad:
        raise click.BadParameter(f"no simulation figure {bad[0]}; choose from "
                                 f"{analysis.SIMULATION_FIGURES}", param_hint="--figures")
    out = _out_dir(out)
    for number in figures:
        panels, caption = analysis.simulation_figure(number, steps, eps, seed)
        stem = out / f"figure{number}"
        analysis.write_json(stem.with_suffix(".json"),
                            dict(caption=caption, steps=steps, eps=eps, seed=seed,
                                 initial_states=analysis.INITIAL_STATES,
                                 panels=analysis.panels_to_json(panels)))
        analysis.write_csv(stem.with_suffix(".csv"),
                           analysis.panels_to_rows(f"figure{number}", panels))
        click.echo(f"{caption}\n  {'panel':<8} {'kind':<9} |h_T| / |h_0| for each initial state")
        for p in panels:
            ratios = "  ".join(f"{e / s:9.4g}" for s, e in zip(p["radius_start"],
                                                             p["radius_end"]))
            click.echo(f"  {p['key']:<8} {p['kind']:<9} {ratios}")
        if _plot_or_hint("plot_simulation", panels, stem.with_suffix(".png"), 4, caption):
            click.echo(f"  wrote {stem}.png")
        click.echo(f"  wrote {stem}.json, {stem}.csv")


@cli.command()
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Folder for figure2_jacobian.png/.csv/.json (created if missing).")
@click.option("--models", default="antisym,lstm", show_default=True,
              help="Comma-separated cells (see `python cli.py params`); a cell with a diffusion "
                   "gamma gives one model per --gammas value.")
@click.option("--gammas", default="0.001,0.01,0.1,1,5,10", show_default=True,
              callback=_number_list(float), help="Diffusion constants (Figure 2's).")
@click.option("--lengths", default="100,200,400,800", show_default=True,
              callback=_number_list(int), help="Sequence lengths T (Figure 2's).")
@click.option("--hidden-size", default=128, show_default=True, type=click.IntRange(min=1),
              help="n, hidden units.")
@click.option("--input-size", default=96, show_default=True, type=click.IntRange(min=1),
              help="m of the Gaussian-noise sequences (96 = one CIFAR-10 row, as in noise-padded "
                   "CIFAR-10).")
@click.option("--eps", default=0.01, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Step size of Euler cells.")
@click.option("--sigma-w", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="Recurrent init scale, W ~ N(0, sigma_w^2 / n) (Appendix C).")
@click.option("--sequences", default=8, show_default=True, type=click.IntRange(min=1),
              help="Input sequences per T; the eigenvalues of all of them are pooled.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of the models' initialisation and of the input noise.")
@click.option("--dtype", default="float64", show_default=True,
              type=click.Choice(["float32", "float64"]), help="Precision of the kernels.")
def jacobian(out, models, gammas, lengths, hidden_size, input_size, eps, sigma_w, sequences,
             seed, dtype):
    """Figure 2: mean and std of |eigenvalues| of dh_T/dh_0 at initialisation, against T.

    J = dh_T/dh_0 comes from each model's own BPTT kernel (the sequence replicated n times,
    dh_T = I, so dh_0 = J). Inputs are independent N(0, 1) sequences (the noise of noise-padded
    CIFAR-10), drawn from default_rng([seed, T]); every model sees the same ones."""
    from nprnn import analysis

    if any(T < 1 for T in lengths):
        raise click.BadParameter(f"lengths must be >= 1, got {lengths}", param_hint="--lengths")
    if any(g < 0 for g in gammas):
        raise click.BadParameter(f"gammas must be >= 0, got {gammas}", param_hint="--gammas")
    built = []
    for name in [s.strip() for s in models.split(",") if s.strip()]:
        if name not in nprnn.CELLS:
            raise click.BadParameter(f"unknown model {name!r}; choose from "
                                     f"{', '.join(nprnn.CELLS)}", param_hint="--models")
        hyper = nprnn.CELLS[name].hyper
        for g in (gammas if "gamma" in hyper else [None]):
            label = name if g is None else f"{name} gamma={g:g}"
            built.append((label, nprnn.make_model(
                name, input_size, hidden_size, num_classes=10, sigma_w=sigma_w, seed=seed,
                dtype=dtype, eps=eps if "eps" in hyper else None, gamma=g)))
    rows = analysis.jacobian_spectra(
        built, lengths,
        lambda T: analysis.gaussian_sequences(sequences, T, input_size, seed=[seed, T]))
    out = _out_dir(out)
    stem = out / "figure2_jacobian"
    analysis.write_csv(stem.with_suffix(".csv"), rows)
    analysis.write_json(stem.with_suffix(".json"), dict(
        inputs="N(0, 1) noise, default_rng([seed, T])", hidden_size=hidden_size,
        input_size=input_size, eps=eps, sigma_w=sigma_w, sequences=sequences, seed=seed,
        dtype=dtype, rows=rows))
    click.echo(f"{'model':<22} {'T':>5} {'mean |lambda|':>14} {'std |lambda|':>13} "
               f"{'max |lambda|':>13}")
    for r in rows:
        click.echo(f"{r['label']:<22} {r['T']:>5} {r['mean']:>14.4g} {r['std']:>13.4g} "
                   f"{r['max']:>13.4g}")
    if _plot_or_hint("plot_jacobian", rows, stem.with_suffix(".png"),
                     f"End-to-end Jacobian at initialisation, n = {hidden_size}, N(0,1) inputs "
                     f"(m = {input_size}), {sequences} sequences per T"):
        click.echo(f"wrote {stem}.png")
    click.echo(f"wrote {stem}.csv, {stem}.json")


@cli.command("plot")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Folder for the PNG and the CSV (created if missing).")
@click.option("--name", default="learning_curves", show_default=True,
              help="File name (without extension) of the PNG and the CSV.")
def plot_runs(runs, out, name):
    """Learning curves of RUNS... (run folders with config.json and metrics.jsonl): loss and
    evaluation accuracy against iterations, labelled by model and task."""
    from nprnn import analysis

    try:
        loaded = analysis.read_runs(runs)
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    stem = _out_dir(out) / name
    analysis.write_csv(stem.with_suffix(".csv"), analysis.runs_to_rows(loaded))
    for r in loaded:
        click.echo(f"{r['name']}: {r['label']}, {len(r['records'])} records")
    if _plot_or_hint("plot_learning_curves", loaded, stem.with_suffix(".png")):
        click.echo(f"wrote {stem}.png")
    click.echo(f"wrote {stem}.csv")


if __name__ == "__main__":
    cli()
