"""nprnn's command line: a thin click group that parses options, calls into `nprnn`, and prints.

    python cli.py params                  parameter counts at the paper's configurations
    python cli.py bench --model antisym   forward / forward+backward timings (see docs/speed.md)
    python cli.py --help                  everything else
"""
import functools
import math
import os
import signal
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import click

import nprnn
from nprnn.study import analysis, plotting, probes
from nprnn.core import autotune
from nprnn.data import datasets, sources
from nprnn.data import info as data_facts
from nprnn.study import bench as B_
from nprnn.runs import train as training
from nprnn.runs.checkpoint import FILENAME, CheckpointError, load_checkpoint
from nprnn.data.datasets import MAX_SEED
from nprnn.data.tasks import TASKS
from nprnn.core.device import DeviceUnavailable, resolve_device
from nprnn.util.files import why_no_folder
from nprnn.core.model import count_params
from nprnn.util.progress import CountBar, SweepBar
from nprnn.runs.train import CONFIG

# Seeds are 63-bit: they become int64 keys of the noise streams (nprnn/data/noise.py).
SEED = click.IntRange(min=0, max=MAX_SEED)


class Folder(click.Path):
    """A folder's path (click.Path, files refused); an empty one, which would silently mean the
    current folder (the repository's root, among the sources), is refused too."""

    def __init__(self):
        super().__init__(file_okay=False)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip() == "":
            self.fail("is empty, which would mean the current folder; name a folder", param, ctx)
        return super().convert(value, param, ctx)


FOLDER = Folder()


class Iterations(click.ParamType):
    """ITER[,ITER...]: distinct iterations >= 1, as a sorted list (train's --lr-decay-at)."""

    name = "ITER[,ITER...]"

    def convert(self, value, param, ctx):
        try:
            return training.parse_iterations(param.name if param else "value", value)
        except training.TrainError as e:
            self.fail(str(e), param, ctx)


ITERATIONS = Iterations()


class FiniteFloat(click.FloatRange):
    """click.FloatRange that also refuses nan and inf. FloatRange lets nan through (every
    comparison with nan is false), and inf wherever no max is given; step sizes, scales and
    rates must be finite numbers."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            within = "" if self.min is None and self.max is None else (
                f" in the range {self._describe_range()}")
            self.fail(f"{number} is not a finite number{within}.", param, ctx)
        return number

    def _describe_range(self):
        """As click's, but an option without bounds (gate_bias) reads as such, not x<=None."""
        if self.min is None and self.max is None:
            return "any finite number"
        return super()._describe_range()


@contextmanager
def _reader_may_leave():
    """A table piped into a reader that stops early (`sweep report ... | head`): the rest of
    the output is dropped without a word, and the command exits as one ended by SIGPIPE (141),
    as other tools do, after finishing its work (the report draws its figure first)."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())        # Python's last flush has nowhere to fail
        sys.exit(128 + signal.SIGPIPE)


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
# simulate, jacobian, plot: the paper's figures. nprnn/study/analysis.py computes the numbers, every
# command writes them (CSV/JSON), and nprnn/study/plotting.py draws the PNG when matplotlib is there.
# ----------------------------------------------------------------------------------------------

def _items(value, what):
    """The comma-separated items of `value`, stripped; empty ones are dropped ("a,,b," is a, b),
    and click.BadParameter says "expected at least one `what`" if none is left. The one rule of
    every comma-separated option."""
    items = [s.strip() for s in value.split(",") if s.strip()]
    if not items:
        raise click.BadParameter(f"expected at least one {what}, got {value!r}")
    return items


def _once(items, value):
    """`items` (parsed from `value`) unless one is given twice: click.BadParameter naming it. For
    the lists that each make rows of their own, where a repeat would only repeat rows."""
    seen = []
    for item in items:
        if item in seen:
            raise click.BadParameter(f"{item} is given twice in {value!r}; give each once")
        seen.append(item)
    return items


def _name_list(what, once=False):
    """A click callback turning "a,b,c" into a list of names (`what`: "model name"); with `once`,
    a name given twice is refused."""
    def parse(ctx, param, value):
        names = _items(value, what)
        return _once(names, value) if once else names
    return parse


def _number_list(kind, once=False):
    """A click callback turning "a,b,c" into a list of `kind` (int or float; floats finite); with
    `once`, a number given twice ("1,1.0" too) is refused."""
    def parse(ctx, param, value):
        try:
            numbers = [kind(v) for v in _items(value, f"{kind.__name__} value")]
        except ValueError:
            raise click.BadParameter(f"expected comma-separated {kind.__name__} values such as "
                                     f"'1,2', got {value!r}") from None
        bad = [x for x in numbers if isinstance(x, float) and not math.isfinite(x)]
        if bad:
            raise click.BadParameter(f"expected finite numbers, got {bad[0]} in {value!r}")
        return _once(numbers, value) if once else numbers
    return parse


def _file_name(ctx, param, value):
    """A click callback for an option naming a file inside --out: a bare name, no folder part."""
    if value in ("", ".", "..") or any(sep and sep in value for sep in (os.sep, os.altsep, "/")):
        raise click.BadParameter(f"expected a file name without a folder (not empty, '.' or "
                                 f"'..', no '/'), got {value!r}")
    return value


def _out_dir(out):
    """The folder `out` as a Path, created with its parents if missing; where it cannot be,
    click.BadParameter for --out naming the path and the reason."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise click.BadParameter(f"cannot create folder {out}: {why_no_folder(path, e)}",
                                 param_hint="--out") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise click.BadParameter(f"cannot write into folder {out}: permission denied",
                                 param_hint="--out")
    return path


def _memory_error(error, lower, note=""):
    """The one-line click.ClickException for a MemoryError (numpy's _ArrayMemoryError among them:
    numpy refuses an impossible allocation at once): numpy's account of it, the options `lower`
    that shrink it, then `note` (what a failed run left behind)."""
    detail = f" ({error})" if str(error) else ""
    return click.ClickException(f"not enough memory for this size{detail}; lower {lower}{note}")


# What running out of memory looks like besides MemoryError: numpy's refusal of a shape whose
# size overflows, and PyTorch's allocators (RuntimeError; torch.OutOfMemoryError on the GPU).
_OUT_OF_MEMORY = ("array is too big", "maximum allowed dimension exceeded", "out of memory",
                  "can't allocate memory")


@contextmanager
def _enough_memory(lower):
    """A MemoryError inside, or a ValueError or RuntimeError that says memory ran out (numpy,
    PyTorch), becomes _memory_error(e, lower)."""
    try:
        yield
    except MemoryError as e:
        raise _memory_error(e, lower) from None
    except (ValueError, RuntimeError) as e:
        if not any(words in str(e).lower() for words in _OUT_OF_MEMORY):
            raise
        raise _memory_error(e, lower) from None


def _given(*names):
    """The options among `names` that were typed on the command line, as "--name"."""
    ctx = click.get_current_context()
    return [training.flag(n) for n in names
            if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]


def _task_lengths(task, lengths):
    """Refuse, before any data is read, --lengths that task `task` cannot have: a length that
    does not fit it (click.BadParameter), or the default lengths, which are for noise, where the
    task has a fixed length (a click.UsageError saying which --lengths to give). A name that is no
    task is get_task's to refuse."""

    spec = TASKS.get(task)
    for T in lengths if spec else []:
        try:
            spec.shape(T)
        except ValueError as e:
            if _given("lengths"):
                raise click.BadParameter(str(e), param_hint="--lengths") from None
            natural = spec.shape()[0]
            raise click.UsageError(f"task {task!r} has a fixed length T = {natural}, and the "
                                   f"default --lengths {','.join(map(str, lengths))} are for "
                                   f"noise: give --lengths {natural}") from None


def _say_which(done, total, label, T):
    """A line on stderr as each (model, T) of `jacobian` starts: at the defaults (and more so
    with trained models of large n) the whole takes minutes."""
    click.echo(f"[{done + 1}/{total}] {label}, T={T}", err=True)


def _earlier(png, *numbers):
    """Those of the files `png`, `numbers` that an earlier run left (call it before writing them),
    deleting the earlier PNG at once: it shows the earlier numbers, and without matplotlib no new
    PNG takes its place, so kept it would disagree with the new numbers written beside it."""
    old = [p for p in (png, *numbers) if p.exists()]
    if png in old:
        png.unlink()
    return old


def _replacing(old):
    """", replacing the earlier X, Y" for the paths `old` (the files this run wrote over), else
    ""."""
    return f", replacing the earlier {', '.join(map(str, old))}" if old else ""


def _draw(old, png, draw, *args, indent=""):
    """Draw `png` with nprnn.study.plotting.<draw>(*args) (`png` among them) and say so; without
    matplotlib print how to get it and, where an earlier run left one (it is in `old`, from
    `_earlier`, which deleted it), that it was removed. Returns the files of `old` that this run
    wrote over: the earlier PNG only if a new one was drawn."""

    try:
        getattr(plotting, draw)(*args)
    except plotting.PlotUnavailable as e:
        click.echo(str(e))
    else:
        click.echo(f"{indent}wrote {png}")
        return old
    if png in old:
        click.echo(f"{indent}removed the earlier {png}: it showed the numbers these replace")
    return [p for p in old if p != png]


@cli.command(short_help="Section 4's two-dimensional RNNs: Figures 1, 3, 4 and 5.")
@click.option("--out", required=True, type=FOLDER,
              help="Folder for figureN.png/.json/.csv (created if missing).")
@click.option("--figures", default="1,3,4,5", show_default=True, callback=_number_list(int),
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

    bad = [f for f in figures if f not in analysis.SIMULATION_FIGURES]
    if bad:
        raise click.BadParameter(f"no simulation figure {bad[0]}; choose from "
                                 f"{analysis.SIMULATION_FIGURES}", param_hint="--figures")
    for option in _given("eps", "seed"):
        takers = [n for n, used in analysis.FIGURE_SETTINGS.items() if option[2:] in used]
        if not set(takers) & set(figures):
            raise click.UsageError(f"{option} is for figures {', '.join(map(str, takers))}, and "
                                   f"none of --figures {','.join(map(str, figures))} uses it; "
                                   f"leave it out")
    out = _out_dir(out)
    for number in figures:
        with _enough_memory("--steps"):
            try:
                panels, summary = analysis.simulation_summary(number, steps, eps, seed)
            except ValueError as e:                 # states beyond float64: eps too large
                raise click.ClickException(str(e)) from None
        caption = summary["caption"]
        stem = out / f"figure{number}"
        png = stem.with_suffix(".png")
        old = _earlier(png, stem.with_suffix(".json"), stem.with_suffix(".csv"))
        analysis.write_json(stem.with_suffix(".json"), summary)
        analysis.write_csv(stem.with_suffix(".csv"),
                           analysis.panels_to_rows(f"figure{number}", panels))
        click.echo(f"{caption}\n  {'panel':<8} {'kind':<9} |h_T| / |h_0| for each initial state")
        for p in panels:
            ratios = "  ".join(f"{e / s:9.4g}" for s, e in zip(p["radius_start"],
                                                             p["radius_end"]))
            panel = f"{p['key']} {p['matrix']}" if p["matrix"] else p["key"]
            click.echo(f"  {panel:<8} {p['kind']:<9} {ratios}")
        old = _draw(old, png, "plot_simulation", panels, png, 4, caption, indent="  ")
        click.echo(f"  wrote {stem}.json, {stem}.csv{_replacing(old)}")


@cli.command(short_help='Figure 2: eigenvalues of dh_T/dh_0, by model and length.')
@click.option("--out", required=True, type=FOLDER,
              help="Folder for figure2_jacobian.png/.csv/.json (created if missing).")
@click.option("--models", default="antisym,lstm", show_default=True,
              callback=_name_list("model name", once=True),
              help="Comma-separated cells (see `python cli.py params`); a cell with a diffusion "
                   "gamma gives one model per --gammas value.")
@click.option("--gammas", default="0.001,0.01,0.1,1,5,10", show_default=True,
              callback=_number_list(float, once=True), help="Diffusion constants (Figure 2's).")
@click.option("--lengths", default="100,200,400,800", show_default=True,
              callback=_number_list(int, once=True), help="Sequence lengths T (Figure 2's).")
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
              help="Take the inputs from this task's test split (nprnn.data.datasets.get_task(TASK, "
                   "T=T)) instead of N(0, 1) noise. A task of fixed length (mnist: 784) needs "
                   "--lengths to be that length. With --checkpoint, pmnist's permutation is the "
                   "one the run was trained with.")
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

    unknown = [m for m in models if m not in nprnn.CELLS]
    if unknown:
        raise click.BadParameter(f"unknown model(s) {', '.join(unknown)}; choose from "
                                 f"{', '.join(nprnn.CELLS)}", param_hint="--models")
    model_options = _given("models", "gammas", "hidden_size", "input_size", "eps", "sigma_w")
    if checkpoints and model_options:
        raise click.UsageError(f"--checkpoint takes the model from the checkpoint; leave out "
                               f"{', '.join(model_options)}")
    if task and "--input-size" in model_options:
        raise click.UsageError("--task sets the input size; leave out --input-size")
    if data_dir is not None and not task:
        raise click.UsageError("--data-dir is where --task's data is; without --task the inputs "
                               "are N(0, 1) noise")
    for option, hyper in (("--gammas", "gamma"), ("--eps", "eps")):
        if option in model_options and not any(hyper in nprnn.CELLS[m].hyper for m in models):
            raise click.UsageError(f"{option} is for cells with {hyper}, and none of "
                                   f"{', '.join(models)} has one; leave it out")
    if any(T < 1 for T in lengths):
        raise click.BadParameter(f"lengths must be >= 1, got {lengths}", param_hint="--lengths")
    if task:
        _task_lengths(task, lengths)
    if any(g < 0 for g in gammas):
        raise click.BadParameter(f"gammas must be >= 0, got {gammas}", param_hint="--gammas")
    out = _out_dir(out)                 # before the work: a bad --out is said at once
    try:
        found = probes.jacobian(models, gammas, hidden_size, input_size, eps, sigma_w,
                                checkpoints, task, data_dir, lengths, sequences, seed, dtype,
                                progress=_say_which)
    except (CheckpointError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except MemoryError as e:
        raise _memory_error(e, "--lengths, --hidden-size, --input-size or --sequences") from None
    rows, built, inputs = found["rows"], found["models"], found["inputs"]
    stem = out / "figure2_jacobian"
    png = stem.with_suffix(".png")
    old = _earlier(png, stem.with_suffix(".csv"), stem.with_suffix(".json"))
    uses_eps = any(m.hyper.get("eps") is not None for _, m in built)
    analysis.write_csv(stem.with_suffix(".csv"), rows)
    analysis.write_json(stem.with_suffix(".json"), dict(
        inputs=inputs, input_size=found["input_size"], checkpoints=list(checkpoints),
        hidden_size=None if checkpoints else hidden_size,
        eps=eps if uses_eps and not checkpoints else None,
        sigma_w=None if checkpoints else sigma_w, sequences=sequences, seed=seed, dtype=dtype,
        rows=rows))
    click.echo(f"{'model':<28} {'T':>5} {'mean |lambda|':>14} {'std |lambda|':>13} "
               f"{'max |lambda|':>13}")
    for r in rows:
        click.echo(f"{r['label']:<28} {r['T']:>5} {r['mean']:>14.4g} {r['std']:>13.4g} "
                   f"{r['max']:>13.4g}")
    for note in analysis.zero_eigenvalue_notes(built, rows, dtype):
        click.echo(f"note: {note}")
    what = "trained models" if checkpoints else f"initialisation, n = {hidden_size}"
    old = _draw(old, png, "plot_jacobian", rows, png,
                f"End-to-end Jacobian dh_T/dh_0 ({what}); inputs: {inputs}, {sequences} per T")
    click.echo(f"wrote {stem}.csv, {stem}.json{_replacing(old)}")


# ----------------------------------------------------------------------------------------------
# gates: what the gates of trained models do at each step
# ----------------------------------------------------------------------------------------------

def _run_task_options(command):
    """--task, --T and --data-dir: what trained runs are fed (SavedRun.feed)."""
    for option in reversed([
            click.option("--task", default=None, help="Feed every run this task's test "
                         "sequences [default: each run's own task]."),
            click.option("--T", "T", default=None, type=click.IntRange(min=1),
                         help="Sequence length of a noise-padded task [default: each run's]."),
            click.option("--data-dir", default=None, type=FOLDER,
                         help="Where the task's data is [default: each run's].")]):
        command = option(command)
    return command


def _echo_table(table, left):
    """Print rows of strings in columns, the first `left` columns flush left, the rest right."""
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(f"{v:<{w}}" if k < left else f"{v:>{w}}"
                             for k, (v, w) in enumerate(zip(row, widths))).rstrip())


@cli.command(short_help='The gates of trained models, step by step.')
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", required=True, type=FOLDER,
              help="Folder for NAME.png/.csv/.json (created if missing).")
@click.option("--name", default="gates", show_default=True, callback=_file_name,
              help="File name (without extension) of the outputs in --out.")
@_run_task_options
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

    out = _out_dir(out)                 # before the work: a bad --out is said at once
    try:
        results = probes.gates(runs, task, T, data_dir, sequences, batch_size, seed,
                               say=functools.partial(click.echo, err=True))
    except (CheckpointError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except MemoryError as e:
        raise _memory_error(e, "--batch-size or --T") from None
    stem = out / name
    png = stem.with_suffix(".png")
    old = _earlier(png, stem.with_suffix(".csv"), stem.with_suffix(".json"))
    analysis.write_csv(stem.with_suffix(".csv"), probes.gate_step_rows(results))
    analysis.write_json(stem.with_suffix(".json"), dict(seed=seed, runs=results))
    _echo_table(probes.gate_table(results), left=4)
    for r in results:
        note = probes.fewer_sequences(r["label"], r["task"], r["sequences"], sequences)
        if note:
            click.echo(note)
    old = _draw(old, png, "plot_gates", results, png)
    click.echo(f"wrote {stem}.csv, {stem}.json{_replacing(old)}")


# ----------------------------------------------------------------------------------------------
# criticality: eq. (5)'s criterion along the trajectories of trained Euler cells
# ----------------------------------------------------------------------------------------------

@cli.command(short_help='The criterion of eq. (5) along test sequences of runs.')
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@_run_task_options
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
    _echo_table(probes.criticality_table(rows), left=3)
    for note in notes:
        click.echo(note)


@cli.command("plot", short_help='Learning curves of runs, side by side.')
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=FOLDER,
              help="Folder for the PNG and the CSV (created if missing).")
@click.option("--name", default="learning_curves", show_default=True, callback=_file_name,
              help="File name (without extension or folder) of the PNG and the CSV.")
def plot_runs(runs, out, name):
    """Learning curves of RUNS... (run folders with config.json and metrics.jsonl): loss and
    evaluation accuracy against iterations, labelled by model and task."""

    try:
        loaded = analysis.read_runs(runs)
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    out = _out_dir(out)
    # NAME.csv and NAME.png, not with_suffix: NAME may have a dot of its own ("curves.v2")
    csv_path, png_path = out / f"{name}.csv", out / f"{name}.png"
    old = _earlier(png_path, csv_path)
    analysis.write_csv(csv_path, analysis.runs_to_rows(loaded))
    for r in loaded:
        click.echo(f"{r['name']}: {r['label']}, {len(r['records'])} records")
    old = _draw(old, png_path, "plot_learning_curves", loaded, png_path)
    click.echo(f"wrote {csv_path}{_replacing(old)}")


def _duration(seconds):
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _at(point):
    return "-" if point is None else f"{point[1]:.2%} at {point[0]:,}"


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
    table = [("run", "model", "task", "settings", "iterations", "time", "split", "last",
              "best")] + [
        (r["name"], r["model"], r["task"], r["settings"],
         f"{r['reached']:,}" + ("" if r["planned"] is None else f" of {r['planned']:,}"),
         "-" if r["time"] is None else _duration(r["time"]), r["split"], _at(r["last"]),
         _at(r["best"])) for r in rows]
    if not markdown:
        _echo_table(table, left=4)
        return
    click.echo("| " + " | ".join(table[0]) + " |")
    click.echo("|" + "---|" * len(table[0]))
    for row in table[1:]:
        click.echo("| " + " | ".join(row) + " |")


# ----------------------------------------------------------------------------------------------
# train, eval: the experiments of section 5 (settings of Appendix C); see nprnn/runs/train.py
# ----------------------------------------------------------------------------------------------

def _run_options(command, defaults=None):
    """`train`'s options for a run's settings, made from nprnn.runs.train.OPTIONS, where each is
    declared once: its default (or the command's own, in `defaults`), its type and range (click
    refuses what the run would), its help."""
    for name, option in reversed(training.OPTIONS.items()):
        flag = training.flag(name)
        default = (defaults or {}).get(name, option.default)
        kw = dict(default=default, help=option.help, show_default=default is not None)
        if option.kind == "int":
            kw["type"] = click.IntRange(min=option.minimum, max=option.maximum)
        elif option.kind == "float":
            kw["type"] = FiniteFloat(min=option.minimum, max=option.maximum,
                                     min_open=option.above, max_open=option.below)
        elif option.kind == "choice":
            kw["type"] = click.Choice(list(option.choices))
        elif option.kind == "folder":
            kw["type"] = FOLDER
        elif option.kind == "iterations":
            kw["type"] = ITERATIONS
        elif option.kind == "flag":
            flag = f"{flag}/--no-{flag[2:]}"
        command = click.option(flag, name, **kw)(command)
    return command


@cli.command(short_help='Train a model on a task in a run folder (resumable).')
@_run_options
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
    given = {k: options[k] for k in options
             if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
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
        raise _memory_error(e, "--hidden, --batch-size, --eval-batch-size or --T",
                            _left_behind(out)) from None
    except training.SecondSignal as e:
        # aborted mid-step; the checkpoints are atomic, so the last one written stands
        at = _saved_iteration(Path(out))
        click.echo(f"{e.name} received again: aborted"
                   + (f". The checkpoint of iteration {at} is kept: continue with `python "
                      f"cli.py train --out {out} --resume`" if at is not None else ""),
                   err=True)
        ctx.exit(128 + signal.Signals[e.name])
    if result["stopped"]:
        ctx.exit(128 + signal.Signals[result["stopped"]])


def _saved_iteration(out):
    """The iteration of run folder `out`'s checkpoint, or None if it has none that loads."""
    try:
        return load_checkpoint(out / FILENAME)["progress"]["iteration"]
    except (CheckpointError, OSError, KeyError):
        return None


def _left_behind(out):
    """What a `train` that failed left in its run folder `out`, and what to do with it ("" if
    nothing): train writes config.json, then the checkpoint of iteration 0, before the first
    step."""

    out, ckpt = Path(out), Path(out) / FILENAME
    if ckpt.is_file():
        at = _saved_iteration(out)
        at = "" if at is None else f" (iteration {at})"
        return (f". The run folder keeps its checkpoint {ckpt}{at}: continue it with `python "
                f"cli.py train --out {out} --resume` where more memory is free (--hidden, "
                f"--batch-size and --T cannot change on resume), or delete {out} to start again "
                f"with smaller sizes")
    if (out / CONFIG).is_file():
        return f". {out} holds a {CONFIG} but no checkpoint: delete it to start again"
    return ""


@cli.command("eval", short_help="Test (or validation) accuracy of a run's checkpoint.")
@click.argument("run", type=click.Path())
@click.option("--split", default="test", show_default=True,
              type=click.Choice(["test", "valid", "train"]), help="Which split to score.")
@click.option("--task", default=None,
              help="Another task with the same input size and classes [default: the run's].")
@click.option("--data-dir", default=None, type=FOLDER,
              help="Where the task's data is [default: the run's].")
@click.option("--T", "T", default=None, type=click.IntRange(min=1),
              help="Sequence length of a noise-padded task [default: the run's].")
@click.option("--batch-size", default=None, type=click.IntRange(min=1),
              help="Examples per forward pass [default: the run's --eval-batch-size].")
@click.option("--device", default="auto", show_default=True,
              type=click.Choice(["cpu", "cuda", "auto"]),
              help="Where to evaluate, whatever the run was trained on.")
def eval_run(run, split, task, data_dir, T, batch_size, device):
    """Evaluate the checkpoint of RUN (a run folder or a checkpoint file): loss and accuracy."""

    shown = CountBar(f"evaluating {split}")
    try:
        with _enough_memory("--batch-size or --T"):
            r = training.evaluate_checkpoint(run, split=split, task_name=task, data_dir=data_dir,
                                             T=T, batch_size=batch_size, device=device,
                                             progress=shown)
    except (training.TrainError, CheckpointError, ValueError, RuntimeError, OSError) as e:
        raise click.ClickException(str(e)) from None
    finally:
        shown.close()
    correct = round(r["accuracy"] * r["count"])
    click.echo(f"{r['model']} from {r['checkpoint']} (iteration {r['iteration']}) on "
               f"{r['task']} (T={r['T']}) {r['split']}, {r['device']}: accuracy "
               f"{r['accuracy']:.4f} ({correct}/{r['count']}), loss {r['loss']:.4f}")


@cli.command(short_help='Time per batch of each model, beside PyTorch when installed.')
@click.option("--model", "models", default="antisym", show_default=True,
              callback=_name_list("model name"), help="Comma-separated models to time, or 'all'.")
@click.option("--batch", "B", default=128, show_default=True, type=click.IntRange(min=1),
              help="Batch size B.")
@click.option("--T", "T", default=784, show_default=True, type=click.IntRange(min=1),
              help="Sequence length T (pixel MNIST: 784).")
@click.option("--input-size", "m", default=1, show_default=True, type=click.IntRange(min=1),
              help="Input size m.")
@click.option("--hidden", "n", default=128, show_default=True, type=click.IntRange(min=1),
              help="Hidden units n.")
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(["float32", "float64"]), help="Precision.")
@click.option("--repeat", default=7, show_default=True, type=click.IntRange(min=1),
              help="Timed runs per measurement; the median is reported.")
@click.option("--torch/--no-torch", "with_torch", default=True, show_default=True,
              help="Time PyTorch beside nprnn when it is installed.")
@click.option("--device", default="cpu", show_default=True,
              type=click.Choice(["cpu", "cuda", "auto"]),
              help="cpu: the @njit kernels; cuda: every GPU kernel version, beside PyTorch on the "
                   "same GPU (eager cell, cuDNN nn.RNN / nn.LSTM); auto: cuda when a GPU is "
                   "usable.")
def bench(models, B, T, m, n, dtype, repeat, with_torch, device):
    """Forward and forward+backward time per batch, beside PyTorch measured in the same run.

    Prints medians of --repeat runs after a warm-up run. The last column is nprnn's time over
    PyTorch's (below 1: nprnn is faster). Install PyTorch with `pip install -e '.[bench]'`."""
    models = list(dict.fromkeys(models))            # each once, in the order given
    if "all" in models and models != ["all"]:
        raise click.BadParameter(f"'all' stands alone, got {','.join(models)!r}",
                                 param_hint="--model")
    names = list(nprnn.CELLS) if models == ["all"] else models
    unknown = [s for s in names if s not in nprnn.CELLS]
    if unknown:
        raise click.BadParameter(f"unknown model(s) {', '.join(unknown)}; choose from "
                                 f"{', '.join(nprnn.CELLS)} or 'all'", param_hint="--model")
    try:                                # no GPU: say so before anything about PyTorch
        device = resolve_device(device)
    except DeviceUnavailable as e:
        raise click.ClickException(str(e)) from None
    if with_torch and not B_.torch_available(device):
        click.echo("PyTorch is not installed: timing nprnn alone (pip install -e '.[bench]' to "
                   "compare)."
                   if not B_.torch_available() else "PyTorch cannot use the GPU (a CPU-only "
                   "build?): timing nprnn alone.")
        with_torch = False
    with _enough_memory("--batch, --T, --input-size or --hidden"):
        if device == "cuda":
            click.echo(f"B={B} T={T} m={m} n={n} {dtype}, median of {repeat}; "
                       f"{autotune.device_name()}")
            rows = B_.run_gpu(names, B, T, m, n, dtype=dtype, repeat=repeat,
                              with_torch=with_torch)
        else:
            click.echo(f"B={B} T={T} m={m} n={n} {dtype}, median of {repeat}; {B_.machine()}")
            rows = B_.run(names, B, T, m, n, dtype=dtype, repeat=repeat, with_torch=with_torch)
    click.echo(B_.format_table(rows))


# ----------------------------------------------------------------------------------------------
# data: build the tasks' caches and describe them (nprnn/data/datasets.py, nprnn/data/sources.py)
# ----------------------------------------------------------------------------------------------

def _data_dir_option(f):
    return click.option("--data-dir", default=None, type=FOLDER,
                        help="Where raw files and caches are [default: $NPRNN_DATA_DIR, else "
                             "./data].")(f)


def _task_choice(*extra):
    return click.Choice([*extra, *TASKS])


def _perm_seed_option(f):
    return click.option("--perm-seed", default=0, show_default=True, type=SEED,
                        help="pmnist's permutation seed (other tasks ignore it).")(f)


@cli.group(short_help='Datasets: build their caches, describe them.')
def data():
    """The tasks' datasets: build their caches, describe them (see data/README.md)."""


@data.command("prepare")
@click.option("--task", "tasks", multiple=True, required=True,
              type=_task_choice("all"),
              help="Task whose cache to build (repeatable; 'all' for every task).")
@_data_dir_option
@_perm_seed_option
@click.option("--download/--no-download", default=True, show_default=True,
              help="Fetch missing raw files from the canonical sources.")
def data_prepare(tasks, data_dir, perm_seed, download):
    """Find (or download) a task's raw files, check them and build DATA_DIR/<task>.h5.

    An existing cache is checked and kept if it is good, rebuilt if not."""
    import time

    names = list(tasks.TASKS) if "all" in tasks else list(dict.fromkeys(tasks))
    failed = []
    for name in names:
        start = time.perf_counter()
        try:
            with datasets.get_task(name, data_dir=data_dir, seed=perm_seed,
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
              type=_task_choice(),
              help="The task to describe.")
@_data_dir_option
@_perm_seed_option
@click.option("--T", "T", default=None, type=click.IntRange(min=1),
              help="Sequence length of a noise-padded task [default: the task's].")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
def data_info(task, data_dir, perm_seed, T, as_json):
    """Shapes, split sizes, label histograms, raw files and their MD5s, and the cache's state.

    Builds nothing: without a usable cache it says where the raw files are and what is missing."""
    import json

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
@functools.partial(_run_options, defaults=dict(valid_size=training.SWEEP_VALID_SIZE))
def sweep_run(out, space, params, sampler, trials, prune, sampler_seed, points, workers,
              scheduler, storage, **options):
    """Run (or continue) the sweep in --out on a Dask cluster: each trial trains a run with the
    options given here held fixed (--valid-size defaults to 5000) and the searched ones set, and
    is recorded in an Optuna study. Ctrl-C asks the trials to checkpoint and stop; running
    `sweep run --out` again continues, with --device and --data-dir if its trials are to run
    elsewhere from now on (e.g. --device cuda)."""
    sw = _sweep_module()
    ctx = click.get_current_context()
    source = ctx.get_parameter_source
    given = {k: options[k] for k in options
             if source(k) == click.core.ParameterSource.COMMANDLINE}
    defined = any(k not in sw.WHERE for k in given) or any(
        source(k) == click.core.ParameterSource.COMMANDLINE for k in SWEEP_DEFINITION)
    stop = training.StopSignals(click.echo)      # a first signal stops, a second aborts
    try:
        fixed = training.resolve_config(**dict({"valid_size": training.SWEEP_VALID_SIZE},
                                               **given))
        where = {k: fixed[k] for k in sw.WHERE if k in given}
        if defined or not (Path(out) / sw.SWEEP).exists():
            the_space = sw.make_space(space, [sw.parse_param(p) for p in params])
            both = sorted(set(the_space) & set(given))
            if both:
                raise sw.SweepError(f"{', '.join(map(training.flag, both))} "
                                    f"is both searched and held fixed: give it one way")
            if sampler is None:
                sampler = "tpe" if any(p.is_range for p in the_space.values()) else "grid"
            args = dict(fixed=fixed, space=the_space, sampler=sampler, trials=trials,
                        prune=prune, seed=sampler_seed, storage=storage)
        else:
            args = {}
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
        with _reader_may_leave():
            sw.report(folder, png, echo=click.echo)
    except (sw.SweepError, OSError) as e:
        raise click.ClickException(str(e)) from None


if __name__ == "__main__":
    cli()
