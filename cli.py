"""nprnn's command line: a thin click group that parses options, calls into `nprnn`, and prints.

    python cli.py params                  parameter counts at the paper's configurations
    python cli.py bench --model antisym   forward / forward+backward timings (see docs/speed.md)
    python cli.py --help                  everything else
"""
import functools
import json
import signal
import time
import warnings

import click

import nprnn
from nprnn.study import analysis, probes
from nprnn.core import autotune
from nprnn.data import datasets, sources
from nprnn.data import info as data_facts
from nprnn.study import bench as B_
from nprnn.runs import train as training
from nprnn.runs.checkpoint import CheckpointError
from nprnn.data.tasks import TASKS
from nprnn.core.device import DeviceUnavailable, resolve_device
from nprnn.core.model import count_params
from nprnn.util.progress import CountBar, SweepBar
from nprnn.shell import output
from nprnn.shell.options import (FOLDER, SEED, FiniteFloat, bench_models, check_jacobian,
                                 check_simulation, data_dir_option, file_name, given_flags,
                                 given_values, name_list, number_list, perm_seed_option,
                                 run_options, run_task_options, seq_len_option, task_choice)


# On a GPU numba warns, once per grid size, of any launch with fewer than 128 blocks. Ours are
# small by design where the work is (a step's totals on one thread, the optimizer over 10k
# parameters, the loss of B rows), and the warnings would break into the progress bar.
SMALL_GRID_WARNING = r"Grid size \d+ will likely result in GPU under-utilization"


@click.group(context_settings=dict(help_option_names=["-h", "--help"]))
def cli():
    """AntisymmetricRNN and its baselines in NumPy + Numba (Chang et al., ICLR 2019)."""
    warnings.filterwarnings("ignore", message=SMALL_GRID_WARNING)


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


@cli.command(short_help="Parameter counts of every model, beside the paper's tables.")
@click.option("--classes", "K", default=10, show_default=True, type=click.IntRange(min=2),
              help="Readout classes K (make_model needs at least 2).")
def params(K):
    """Parameter count of each model at the paper's configurations, beside the paper's column.

    Counts include the readout (W_out, b_out); W of the antisymmetric models counts n(n-1)/2."""
    click.echo(f"{'table':<20} {'model':<15} {'units':>5} {'m':>3} {'ours':>8} {'paper':>6}")
    for table, name, n, m, paper in PAPER_CONFIGS:
        count = count_params(nprnn.CELLS[name], m, n, K)
        click.echo(f"{table:<20} {name:<15} {n:>5} {m:>3} {count:>8,} {paper:>6}")
    click.echo("\nAll models at n=128, m=1:")
    for name, cell in nprnn.CELLS.items():
        click.echo(f"  {name:<15} {count_params(cell, 1, 128, K):>8,}  {cell.summary}")


# ----------------------------------------------------------------------------------------------
# simulate, jacobian, plot: the paper's figures. nprnn/study/analysis.py computes the numbers,
# every command writes them (CSV/JSON), and nprnn/study/plotting.py draws the PNG when matplotlib
# is there.
# ----------------------------------------------------------------------------------------------

@cli.command(short_help="Section 4's two-dimensional RNNs: Figures 1, 3, 4 and 5.")
@click.option("--out", required=True, type=FOLDER,
              help="Folder for figureN.png/.json/.csv (created if missing).")
@click.option("--figures", default="1,3,4,5", show_default=True, callback=number_list(int),
              help="Which of the paper's simulation figures: 1 (section 4), 3, 4, 5 (App. D).")
@click.option("--steps", default=50, show_default=True, type=click.IntRange(min=1),
              help="T, the number of steps.")
@click.option("--eps", default=0.1, show_default=True,
              type=FiniteFloat(min=0, min_open=True),
              help="Step size of feedback panels (Figures 1, 4, 5).")
@click.option("--seed", default=0, show_default=True, type=SEED,
              help="Seed of Figure 1's random matrices ((a), (c); (d) uses seed+1) and of "
                   "Figure 5's input (Figures 3 and 4 use the paper's seeds 1-16).")
def simulate(out, figures, steps, eps, seed):
    """Section 4's two-dimensional RNNs from (0, 0.5), (-0.5, -0.5), (0.5, -0.75).

    For each figure N: figureN.json (the settings it used, matrices, eigenvalues, |h| at
    start/end/min/max per initial state), figureN.csv (every state h_t) and figureN.png. --eps or
    --seed given for figures none of which uses it is refused. The choices the paper leaves open
    are stated in nprnn/study/analysis.py."""

    check_simulation(figures)
    out = output.out_dir(out)
    for number in figures:
        with output.enough_memory("--steps"):
            try:
                panels, summary = analysis.simulation_summary(number, steps, eps, seed)
            except ValueError as e:                 # states beyond float64: eps too large
                raise click.ClickException(str(e)) from None
        stem = out / f"figure{number}"
        png = stem.with_suffix(".png")
        old = output.earlier(png, stem.with_suffix(".json"), stem.with_suffix(".csv"))
        click.echo("\n".join(probes.write_simulation(stem, number, panels, summary)))
        old = output.draw(old, png, "plot_simulation", panels, png, 4, summary["caption"],
                          indent="  ")
        click.echo(f"  wrote {stem}.json, {stem}.csv{output.replacing(old)}")


@cli.command(short_help='Figure 2: eigenvalues of dh_T/dh_0, by model and length.')
@click.option("--out", required=True, type=FOLDER,
              help="Folder for figure2_jacobian.png/.csv/.json (created if missing).")
@click.option("--models", default="antisym,lstm", show_default=True,
              callback=name_list("model name", only_once=True),
              help="Comma-separated cells (see `python cli.py params`); a cell with a diffusion "
                   "gamma gives one model per --gammas value.")
@click.option("--gammas", default="0.001,0.01,0.1,1,5,10", show_default=True,
              callback=number_list(float, only_once=True), help="Diffusion constants (Figure 2's).")
@click.option("--lengths", default="100,200,400,800", show_default=True,
              callback=number_list(int, only_once=True), help="Sequence lengths T (Figure 2's).")
@click.option("--hidden-size", default=128, show_default=True, type=click.IntRange(min=1),
              help="n, hidden units.")
@click.option("--input-size", default=96, show_default=True, type=click.IntRange(min=1),
              help="m of the Gaussian-noise sequences (96 = one CIFAR-10 row, as in noise-padded "
                   "CIFAR-10).")
@click.option("--eps", default=0.01, show_default=True,
              type=FiniteFloat(min=0, min_open=True), help="Step size of Euler cells.")
@click.option("--sigma-w", default=1.0, show_default=True, type=FiniteFloat(min=0),
              help="Recurrent init scale, W ~ N(0, sigma_w^2 / n) (Appendix C).")
@click.option("--checkpoint", "checkpoints", multiple=True,
              type=click.Path(exists=True),
              help="A trained model instead: a run folder or checkpoint file written by `train`. "
                   "Repeat for several. Replaces --models, --gammas, --hidden-size, "
                   "--input-size, --eps, --sigma-w.")
@click.option("--task", default=None,
              help="Take the inputs from this task's test split "
                   "(nprnn.data.datasets.get_task(TASK, T=T)) instead of N(0, 1) noise. A task "
                   "of fixed length (mnist: 784) needs --lengths to be that length. With "
                   "--checkpoint, pmnist's permutation is the one the run was trained with.")
@click.option("--data-dir", default=None, type=FOLDER,
              help="Data folder for --task [default: the one a --checkpoint run recorded, else "
                   "the datasets module's default].")
@click.option("--sequences", default=8, show_default=True, type=click.IntRange(min=1),
              help="Input sequences per T; the eigenvalues of all of them are pooled.")
@click.option("--seed", default=0, show_default=True, type=SEED,
              help="Seed of the models' initialisation (without --checkpoint) and of the "
                   "inputs: the N(0, 1) noise, or with --task which test sequences are drawn.")
@click.option("--dtype", default="float64", show_default=True,
              type=click.Choice(["float32", "float64"]), help="Precision of the kernels.")
def jacobian(out, models, gammas, lengths, hidden_size, input_size, eps, sigma_w, checkpoints,
             task, data_dir, sequences, seed, dtype):
    """Figure 2: mean and std of |eigenvalues| of dh_T/dh_0 against T, at initialisation (or of
    trained checkpoints).

    J = dh_T/dh_0 comes from each model's own BPTT kernel (the sequence replicated n times,
    dh_T = I, so dh_0 = J). Inputs are independent N(0, 1) sequences (the noise of noise-padded
    CIFAR-10) drawn from default_rng([seed, T]), or test sequences of a task (--task) drawn by
    the seed; every model sees the same ones. A line on stderr names each (model, T) as it
    starts."""

    check_jacobian(models, gammas, lengths, checkpoints, task, data_dir)
    out = output.out_dir(out)                 # before the work: a bad --out is said at once
    try:
        found = probes.jacobian(models, gammas, hidden_size, input_size, eps, sigma_w,
                                checkpoints, task, data_dir, lengths, sequences, seed, dtype,
                                progress=output.say_which)
    except (CheckpointError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except MemoryError as e:
        raise output.memory_error(e, "--lengths, --hidden-size, --input-size or "
                                     "--sequences") from None
    stem = out / "figure2_jacobian"
    png = stem.with_suffix(".png")
    old = output.earlier(png, stem.with_suffix(".csv"), stem.with_suffix(".json"))
    click.echo("\n".join(probes.write_jacobian(stem, found, checkpoints, hidden_size, eps,
                                                sigma_w, sequences, seed, dtype)))
    what = "trained models" if checkpoints else f"initialisation, n = {hidden_size}"
    old = output.draw(old, png, "plot_jacobian", found["rows"], png,
                      f"End-to-end Jacobian dh_T/dh_0 ({what}); inputs: {found['inputs']}, "
                      f"{sequences} per T")
    click.echo(f"wrote {stem}.csv, {stem}.json{output.replacing(old)}")


# ----------------------------------------------------------------------------------------------
# gates: what the gates of trained models do at each step
# ----------------------------------------------------------------------------------------------

@cli.command(short_help='The gates of trained models, step by step.')
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", required=True, type=FOLDER,
              help="Folder for NAME.png/.csv/.json (created if missing).")
@click.option("--name", default="gates", show_default=True, callback=file_name,
              help="File name (without extension) of the outputs in --out.")
@run_task_options
@click.option("--sequences", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Test sequences to pool over: the first of the order --seed shuffles.")
@click.option("--batch-size", default=100, show_default=True, type=click.IntRange(min=1),
              help="Sequences per forward pass (memory: T x B x the cell's gates).")
@click.option("--seed", default=0, show_default=True, type=SEED,
              help="Which test sequences are drawn (the same for every run of one task).")
def gates(runs, out, name, task, T, data_dir, sequences, batch_size, seed):
    """The gates of trained models, step by step.

    RUNS are run folders or checkpoint files of `train` whose models have gates: z_t of
    antisym-gated, ablation (eq. 13) and antisym-xgate, i, f, o of the LSTMs, r, z of the GRU.
    Each runs forward over test sequences of its task, in the dtype it was trained in. Writes
    NAME.csv (the mean and standard deviation of every gate at every step, over sequences and
    units), NAME.json (the same, and each gate over the image steps and over the noise steps of
    a noise-padded task) and NAME.png, and prints the latter table."""

    out = output.out_dir(out)                 # before the work: a bad --out is said at once
    try:
        results = probes.gates(runs, task, T, data_dir, sequences, batch_size, seed,
                               say=functools.partial(click.echo, err=True))
    except (CheckpointError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except MemoryError as e:
        raise output.memory_error(e, "--batch-size or --seq-len") from None
    stem = out / name
    png = stem.with_suffix(".png")
    old = output.earlier(png, stem.with_suffix(".csv"), stem.with_suffix(".json"))
    analysis.write_csv(stem.with_suffix(".csv"), probes.gate_step_rows(results))
    analysis.write_json(stem.with_suffix(".json"), dict(seed=seed, runs=results))
    output.echo_table(probes.gate_table(results), left=4)
    for r in results:
        note = probes.fewer_sequences(r["label"], r["task"], r["sequences"], sequences)
        if note:
            click.echo(note)
    old = output.draw(old, png, "plot_gates", results, png)
    click.echo(f"wrote {stem}.csv, {stem}.json{output.replacing(old)}")


# ----------------------------------------------------------------------------------------------
# criticality: eq. (5)'s criterion along the trajectories of trained Euler cells
# ----------------------------------------------------------------------------------------------

@cli.command(short_help='The criterion of eq. (5) along test sequences of runs.')
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@run_task_options
@click.option("--sequences", default=8, show_default=True, type=click.IntRange(min=1),
              help="Test sequences, the first of the order --seed shuffles (each step of each "
                   "costs an n x n eigenvalue problem).")
@click.option("--segments", default=8, show_default=True, type=click.IntRange(min=1),
              help="Runs of steps that the table summarises, of nearly equal length.")
@click.option("--seed", default=0, show_default=True, type=SEED,
              help="Which test sequences are drawn (the same for every run of one task).")
def criticality(runs, task, T, data_dir, sequences, segments, seed):
    """The critical criterion (equation 5) along test sequences, for trained Euler cells.

    RUNS are run folders or checkpoint files of the Euler cells (the models with --eps).
    At every step t, L_t = (dh_t/dh_{t-1} - I) / eps is the Jacobian of the ODE whose Euler step
    the cell is (from the model's own BPTT, in float64); the criterion asks that the real parts
    of its eigenvalues be near 0, and a positive one is a direction that grows. Prints, for runs
    of steps, the mean and the largest of max_i Re lambda_i(L_t) over sequences and steps, and
    the share of (sequence, step) pairs where it is positive."""

    try:
        rows, notes = probes.criticality(runs, task, T, data_dir, sequences, segments, seed,
                                         say=functools.partial(click.echo, err=True))
    except (CheckpointError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    output.echo_table(probes.criticality_table(rows), left=3)
    for note in notes:
        click.echo(note)


@cli.command("plot", short_help='Learning curves of runs, side by side.')
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=FOLDER,
              help="Folder for the PNG and the CSV (created if missing).")
@click.option("--name", default="learning_curves", show_default=True, callback=file_name,
              help="File name (without extension or folder) of the PNG and the CSV.")
def plot_runs(runs, out, name):
    """Learning curves of RUNS... (run folders with config.json and metrics.jsonl): loss and
    evaluation accuracy against iterations, labelled by model and task."""

    try:
        loaded = analysis.read_runs(runs)
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    out = output.out_dir(out)
    # NAME.csv and NAME.png, not with_suffix: NAME may have a dot of its own ("curves.v2")
    csv_path, png_path = out / f"{name}.csv", out / f"{name}.png"
    old = output.earlier(png_path, csv_path)
    analysis.write_csv(csv_path, analysis.runs_to_rows(loaded))
    for r in loaded:
        click.echo(f"{r['name']}: {r['label']}, {len(r['records'])} records")
    old = output.draw(old, png_path, "plot_learning_curves", loaded, png_path)
    click.echo(f"wrote {csv_path}{output.replacing(old)}")


@cli.command("results", short_help='What runs reached: a row per run folder.')
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--markdown", is_flag=True, help="Print a Markdown table (for the docs).")
def results(runs, markdown):
    """What RUNS... (run folders, finished or not) have reached: a row per run with its
    settings, the iterations logged of those asked for, its wall time so far, and the last and
    the best accuracy on its evaluation split (test; valid for a run with --valid-size)."""
    try:
        rows = [analysis.run_summary(r) for r in analysis.read_runs(runs, empty_ok=True)]
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    table = output.results_table(rows)
    if markdown:
        output.echo_markdown(table)
    else:
        output.echo_table(table, left=4)


# ----------------------------------------------------------------------------------------------
# train, eval: the experiments of section 5 (settings of Appendix C); see nprnn/runs/train.py
# ----------------------------------------------------------------------------------------------

@cli.command(short_help='Train a model on a task in a run folder (resumable).')
@run_options
@click.option("--out", default=None, type=FOLDER,
              help="Run folder [default: runs/MODEL-TASK].")
@click.option("--resume", is_flag=True,
              help="Continue the run in --out from its checkpoint; only "
                   + ", ".join(training.flag(k) for k in training.CHANGEABLE_ON_RESUME)
                   + " may change.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Show the progress bar (on a terminal; one line per log interval otherwise). "
                   "Evaluations and a stop are reported either way.")
@click.option("--allow-lost-log", is_flag=True,
              help="With --resume: go on though metrics.jsonl is missing or shorter than the "
                   "checkpoint recorded (its curves so far are lost).")
def train(progress, out, resume, allow_lost_log, **options):
    """Train a model on a task; writes runs/NAME/config.json, metrics.jsonl, checkpoint.h5.

    Prints the resolved configuration and the parameter count, a progress bar (it/s, loss and
    accuracy over the current logging interval), each evaluation, and the final test accuracy.
    Ctrl-C (or SIGTERM) finishes the step, writes a checkpoint and exits with status 130 (143
    for SIGTERM), as a shell does for a command a signal ended, so that `train ... && next`
    does not go on; --resume continues bit for bit."""

    ctx = click.get_current_context()
    if out is None:
        out = f"runs/{options['model']}-{options['task']}"
    given = given_values(options)
    try:
        if resume:
            result = training.train(out=out, resume=True, given=given, echo=click.echo,
                                    progress=progress, allow_lost_log=allow_lost_log)
        elif allow_lost_log:
            raise click.BadParameter("is for --resume: a new run has no log to lose",
                                     param_hint="--allow-lost-log")
        else:
            result = training.train(options, out, echo=click.echo, progress=progress)
    except (training.TrainError, CheckpointError, ValueError, RuntimeError, OSError) as e:
        raise click.ClickException(str(e)) from None
    except MemoryError as e:
        raise output.memory_error(e, "--hidden, --batch-size, --eval-batch-size or --seq-len",
                                  output.left_behind(out)) from None
    except training.SecondSignal as e:
        click.echo(output.aborted(e.name, out), err=True)
        ctx.exit(128 + signal.Signals[e.name])
    if result["stopped"]:
        ctx.exit(128 + signal.Signals[result["stopped"]])


@cli.command("eval", short_help="Test (or validation) metrics of a run's checkpoint.")
@click.argument("run", type=click.Path())
@click.option("--split", default="test", show_default=True,
              type=click.Choice(["test", "valid", "train"]), help="Which split to score.")
@click.option("--task", default=None,
              help="Another task with the same input size and classes [default: the run's].")
@click.option("--data-dir", default=None, type=FOLDER,
              help="Where the task's data is [default: the run's].")
@seq_len_option("T of a noise-padded or synthetic task (copy: the delay) [default: the "
                "run's].")
@click.option("--batch-size", default=None, type=click.IntRange(min=1),
              help="Examples per forward pass [default: the run's --eval-batch-size].")
@click.option("--device", default="auto", show_default=True,
              type=click.Choice(["cpu", "cuda", "auto"]),
              help="Where to evaluate, whatever the run was trained on.")
def eval_run(run, split, task, data_dir, T, batch_size, device):
    """Evaluate the checkpoint of RUN (a run folder or a checkpoint file) by its task's metric:
    loss and accuracy, or the MSE (adding); and beside them what a model without memory scores,
    where the task says (adding, copy)."""

    shown = CountBar(f"evaluating {split}")
    try:
        with output.enough_memory("--batch-size or --seq-len"):
            r = training.evaluate_checkpoint(run, split=split, task_name=task, data_dir=data_dir,
                                             T=T, batch_size=batch_size, device=device,
                                             progress=shown)
    except (training.TrainError, CheckpointError, ValueError, RuntimeError, OSError) as e:
        raise click.ClickException(str(e)) from None
    finally:
        shown.close()
    click.echo(f"{r['model']} from {r['checkpoint']} (iteration {r['iteration']}) on "
               f"{r['task']} (T={r['T']}) {r['split']}, {r['device']}: "
               f"{output.evaluation(r)}")


@cli.command(short_help='Time per batch of each model, beside PyTorch when installed.')
@click.option("--model", "models", default="antisym", show_default=True,
              callback=name_list("model name"), help="Comma-separated models to time, or 'all'.")
@click.option("--batch", "B", default=128, show_default=True, type=click.IntRange(min=1),
              help="Batch size B.")
@click.option("--T", "T", default=784, show_default=True, type=click.IntRange(min=1),
              help="Sequence length T (pixel MNIST: 784).")
@click.option("--input-size", "m", default=1, show_default=True, type=click.IntRange(min=1),
              help="Input size m.")
@click.option("--hidden", "n", default=128, show_default=True, type=click.IntRange(min=1),
              help="Hidden units n.")
@click.option("--layers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Stacked layers (PyTorch's num_layers).")
@click.option("--readout", default="last", show_default=True,
              type=click.Choice(["last", "every"]),
              help="A readout and cross-entropy at the last step, or at every step.")
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(["float32", "float64"]), help="Precision.")
@click.option("--repeat", default=7, show_default=True, type=click.IntRange(min=1),
              help="Timed runs per measurement; the median is reported.")
@click.option("--torch/--no-torch", "with_torch", default=True, show_default=True,
              help="Time PyTorch beside nprnn when it is installed.")
@click.option("--torch-layer", is_flag=True,
              help="Time PyTorch training steps (forward, backward, SGD) with the cell as "
                   "nprnn.torch.Recurrent, beside the same steps with the plain PyTorch cell, "
                   "on --device.")
@click.option("--device", default="cpu", show_default=True,
              type=click.Choice(["cpu", "cuda", "auto"]),
              help="cpu: the @njit kernels; cuda: every GPU kernel version, beside PyTorch on the "
                   "same GPU (eager cell, cuDNN nn.RNN / nn.LSTM); auto: cuda when a GPU is "
                   "usable.")
def bench(models, B, T, m, n, layers, readout, dtype, repeat, with_torch, torch_layer, device):
    """Forward and forward+backward time per batch, beside PyTorch measured in the same run.

    Prints medians of --repeat runs after a warm-up run. The last column is nprnn's time over
    PyTorch's (below 1: nprnn is faster). Install PyTorch with `pip install -e '.[bench]'`."""
    names = bench_models(models)
    try:                                # no GPU: say so before anything about PyTorch
        device = resolve_device(device)
    except DeviceUnavailable as e:
        raise click.ClickException(str(e)) from None
    if torch_layer and not B_.torch_available(device):
        raise click.UsageError("--torch-layer times nprnn.torch and needs PyTorch (pip install "
                               "-e '.[torch]')" + (", a build that can use the GPU" if
                                                   device == "cuda" else ""), ctx=None)
    if with_torch and not B_.torch_available(device):
        click.echo("PyTorch is not installed: timing nprnn alone (pip install -e '.[bench]' to "
                   "compare)."
                   if not B_.torch_available() else "PyTorch cannot use the GPU (a CPU-only "
                   "build?): timing nprnn alone.")
        with_torch = False
    shape = f"B={B} T={T} m={m} n={n} layers={layers} readout={readout} {dtype}"
    with output.enough_memory("--batch, --T, --input-size, --hidden or --layers"):
        if device == "cuda" and torch_layer:
            click.echo(f"{shape}, median of {repeat}; {autotune.device_name()}")
            rows = B_.run(names, B, T, m, n, dtype=dtype, repeat=repeat, layers=layers,
                          readout=readout, torch_layer=True, device="cuda")
        elif device == "cuda":
            click.echo(f"{shape}, median of {repeat}; {autotune.device_name()}")
            rows = B_.run_gpu(names, B, T, m, n, dtype=dtype, repeat=repeat,
                              with_torch=with_torch, layers=layers, readout=readout)
        else:
            click.echo(f"{shape}, median of {repeat}; {B_.machine()}")
            rows = B_.run(names, B, T, m, n, dtype=dtype, repeat=repeat, with_torch=with_torch,
                          layers=layers, readout=readout, torch_layer=torch_layer)
    click.echo(B_.format_table(rows))


# ----------------------------------------------------------------------------------------------
# data: build the tasks' caches and describe them (nprnn/data/datasets.py, nprnn/data/sources.py)
# ----------------------------------------------------------------------------------------------

@cli.group(short_help='Datasets: build their caches, describe them.')
def data():
    """The tasks' datasets: build their caches, describe them (see data/README.md)."""


@data.command("prepare")
@click.option("--task", "tasks", multiple=True, required=True,
              type=task_choice("all"),
              help="Task whose cache to build (repeatable; 'all' for every task).")
@data_dir_option
@perm_seed_option
@seq_len_option("T of the synthetic tasks, whose caches are per T (copy: the delay); 'all' "
                "prepares them only with it.")
@click.option("--download/--no-download", default=True, show_default=True,
              help="Fetch missing raw files from the canonical sources.")
def data_prepare(tasks, data_dir, perm_seed, T, download):
    """Find (or download) a task's raw files, check them and build DATA_DIR/<task>.h5; for a
    synthetic task, draw its valid and test sets into DATA_DIR/<task>-T<T>.h5.

    An existing cache is checked and kept if it is good, rebuilt if not."""
    names = list(TASKS) if "all" in tasks else list(dict.fromkeys(tasks))
    synthetic = [n for n in names if TASKS[n].synthetic]
    if T is not None and not synthetic:
        raise click.BadParameter(f"is for the synthetic tasks "
                                 f"({', '.join(n for n in TASKS if TASKS[n].synthetic)}), whose "
                                 f"caches are per T", param_hint="--seq-len")
    failed = []
    for name in names:
        start = time.perf_counter()
        if "all" in tasks and T is None and name in synthetic:
            click.echo(f"{name}: skipped (its valid and test sets are per T: give --seq-len T)")
            continue
        try:
            with output.enough_memory("--seq-len"), datasets.get_task(
                    name, data_dir=data_dir, seed=perm_seed, T=T if name in synthetic else None,
                    download=download) as task:
                sizes = ", ".join(f"{s} {task.size(s):,}" for s in ("train", "test"))
                click.echo(f"{name}: {task.path} ({sizes}; T={task.T}, m={task.m}) ready in "
                           f"{time.perf_counter() - start:.1f} s")
        except (sources.DataError, ValueError, RuntimeError, OSError) as e:
            if len(names) == 1:
                raise click.ClickException(str(e)) from None
            click.echo(f"{name}: FAILED\n{e}\n", err=True)
            failed.append(name)
    if failed:
        raise click.ClickException(f"not prepared: {', '.join(failed)} (reasons above)")


@data.command("info")
@click.option("--task", required=True,
              type=task_choice(),
              help="The task to describe.")
@data_dir_option
@perm_seed_option
@seq_len_option("T of a noise-padded task [default: the task's] or a synthetic one "
                "(needed; copy: the delay).")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
def data_info(task, data_dir, perm_seed, T, as_json):
    """Shapes, split sizes, label histograms, raw files and their MD5s, and the cache's state.

    Builds nothing: without a usable cache it says where the raw files are and what is missing."""
    try:
        facts, lines = data_facts.describe(task, data_dir, perm_seed, T)
    except (sources.DataError, ValueError, RuntimeError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(facts, indent=2) if as_json else "\n".join(lines))


# ----------------------------------------------------------------------------------------------
# sweep: hyperparameter searches on Dask workers, recorded as an Optuna study (nprnn/sweep/)
# ----------------------------------------------------------------------------------------------

def _sweep_module():
    """nprnn.sweep, which needs the sweep extra (optuna, dask.distributed): imported by the
    sweep commands alone, so that the rest of the CLI runs without them."""
    try:
        from nprnn import sweep
    except ImportError as e:
        raise click.ClickException(f"the sweep commands need the sweep extra ({e}): "
                                   f"pip install -e '.[sweep]'") from None
    return sweep


@cli.group(short_help='Search hyperparameters on a validation split (Optuna, Dask).')
def sweep():
    """Search hyperparameters: trials are ordinary runs under sweeps/NAME/trials/, chosen on a
    validation split (see docs/sweeps.md)."""


SWEEP_DEFINITION = ("space", "params", "sampler", "trials", "prune", "sampler_seed")


@sweep.command("run")
@click.option("--out", required=True, type=FOLDER,
              help="The sweep folder, e.g. sweeps/NAME (run again on it to continue).")
@click.option("--space", default=None, help="A named space: appendix-c (Chang et al.'s grid: "
              "sigma_w, eps, gamma, lr, optimizer).")
@click.option("--param", "params", multiple=True, metavar="NAME=V1,V2,...|NAME=LOW:HIGH[:log]",
              help="Search an option over these values, or a range of a number option "
                   "(repeatable; adds to or replaces the --space axis of that name).")
@click.option("--sampler", type=click.Choice(["grid", "random", "tpe"]), default=None,
              help="How points are chosen [default: grid, or tpe where a range is given].")
@click.option("--trials", type=click.IntRange(min=1), default=None,
              help="Trials in all [default: the whole grid; random and tpe need it].")
@click.option("--prune/--no-prune", default=False, show_default=True,
              help="Stop trials early by successive halving on the validation accuracy.")
@click.option("--sampler-seed", type=SEED, default=0, show_default=True,
              help="Seed of the grid's order and of the random and tpe samplers.")
@click.option("--enqueue", "points", multiple=True, metavar="NAME=V,NAME=V,...",
              help="Run this point before any the sampler draws (repeatable; random and tpe; "
                   "a value for every searched option), e.g. a known good one.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Workers of the local cluster [default: one per GPU with --device cuda, "
                   "else one per two cores].")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Use this Dask cluster (e.g. tcp://HOST:8786) instead of a local one.")
@click.option("--storage", default=None, metavar="URL",
              help="An Optuna storage URL (e.g. postgresql://...) [default: study.journal in "
                   "the sweep folder].")
@functools.partial(run_options, defaults=dict(valid_size=training.SWEEP_VALID_SIZE))
def sweep_run(out, space, params, sampler, trials, prune, sampler_seed, points, workers,
              scheduler, storage, **options):
    """Run (or continue) the sweep in --out on a Dask cluster: each trial trains a run with the
    options given here held fixed (--valid-size defaults to 5000) and the searched ones set, and
    is recorded in an Optuna study. Ctrl-C asks the trials to checkpoint and stop; running
    `sweep run --out` again continues, with --device and --data-dir if its trials are to run
    elsewhere from now on (e.g. --device cuda)."""
    sw = _sweep_module()
    ctx = click.get_current_context()
    defines = bool(given_flags(*SWEEP_DEFINITION))
    stop = training.StopSignals(click.echo)      # a first signal stops, a second aborts
    try:
        where, args = sw.run_arguments(out, given_values(options), defines, space, params,
                                       sampler, trials, prune, sampler_seed, storage)
        bar = SweepBar()
        with stop:
            result = sw.run(out, workers=workers, scheduler=scheduler, echo=bar.message,
                            stop=lambda: stop.stopping() is not None, progress=bar,
                            where=where, enqueue_points=points, **args)
        bar.close()
    except (sw.SweepError, training.TrainError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    if result["stopped"]:
        click.echo(f"stopped with {result['done']} of {result['total']} trials recorded; "
                   f"continue with: python cli.py sweep run --out {out}")
        ctx.exit(130)
    if not result["complete"]:
        click.echo(f"{result['done']} of {result['total']} trials recorded; the others are held "
                   f"by another `sweep run` (taken over once it has not answered for 10 "
                   f"minutes): run `python cli.py sweep run --out {out}` again later")
        return
    click.echo(f"all {result['total']} trials recorded; the table: python cli.py sweep report "
               f"{out}")


@sweep.command("report")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--png", default=None, type=click.Path(dir_okay=False),
              help="Where to draw accuracy against each hyperparameter [default: "
                   "FOLDER/sweep.png].")
def sweep_report(folder, png):
    """Print a table of the sweep's trials (settings, state, iterations, best validation
    accuracy, test accuracy of the best checkpoint) and the chosen trial; draw a PNG."""
    sw = _sweep_module()
    try:
        with output.reader_may_leave():
            sw.report(folder, png, echo=click.echo)
    except (sw.SweepError, OSError) as e:
        raise click.ClickException(str(e)) from None


if __name__ == "__main__":
    cli()
