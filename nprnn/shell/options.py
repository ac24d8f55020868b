"""cli.py's options: their types (a folder, iterations, finite floats, seeds), the callbacks that
parse comma-separated lists, the options shared by several commands (`train`'s, made from
nprnn.runs.train.OPTIONS), and the checks of what a command's options say together, made
before any work so that a mistake is said at once.
"""
import math
import os

import click

from .. import CELLS
from ..data.datasets import MAX_SEED
from ..data.tasks import TASKS
from ..runs import train as training
from ..study import analysis

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


# ----------------------------------------------------------------------------------------------
# comma-separated lists and file names
# ----------------------------------------------------------------------------------------------

def items(value, what):
    """The comma-separated items of `value`, stripped; empty ones are dropped ("a,,b," is a, b),
    and click.BadParameter says "expected at least one `what`" if none is left. The one rule of
    every comma-separated option."""
    found = [s.strip() for s in value.split(",") if s.strip()]
    if not found:
        raise click.BadParameter(f"expected at least one {what}, got {value!r}")
    return found


def once(found, value):
    """`found` (the items parsed from `value`) unless one is given twice: click.BadParameter
    naming it. For the lists that each make rows of their own, where a repeat would only repeat
    rows."""
    seen = []
    for item in found:
        if item in seen:
            raise click.BadParameter(f"{item} is given twice in {value!r}; give each once")
        seen.append(item)
    return found


def name_list(what, only_once=False):
    """A click callback turning "a,b,c" into a list of names (`what`: "model name"); with
    `only_once`, a name given twice is refused."""
    def parse(ctx, param, value):
        names = items(value, what)
        return once(names, value) if only_once else names
    return parse


def number_list(kind, only_once=False):
    """A click callback turning "a,b,c" into a list of `kind` (int or float; floats finite); with
    `only_once`, a number given twice ("1,1.0" too) is refused."""
    def parse(ctx, param, value):
        try:
            numbers = [kind(v) for v in items(value, f"{kind.__name__} value")]
        except ValueError:
            raise click.BadParameter(f"expected comma-separated {kind.__name__} values such as "
                                     f"'1,2', got {value!r}") from None
        bad = [x for x in numbers if isinstance(x, float) and not math.isfinite(x)]
        if bad:
            raise click.BadParameter(f"expected finite numbers, got {bad[0]} in {value!r}")
        return once(numbers, value) if only_once else numbers
    return parse


def file_name(ctx, param, value):
    """A click callback for an option naming a file inside --out: a bare name, no folder part."""
    if value in ("", ".", "..") or any(sep and sep in value for sep in (os.sep, os.altsep, "/")):
        raise click.BadParameter(f"expected a file name without a folder (not empty, '.' or "
                                 f"'..', no '/'), got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------
# what was typed, and what the options of one command say together
# ----------------------------------------------------------------------------------------------

def _typed(name):
    return (click.get_current_context().get_parameter_source(name)
            == click.core.ParameterSource.COMMANDLINE)


def given_flags(*names):
    """The options among `names` that were typed on the command line, as "--name"."""
    return [training.flag(n) for n in names if _typed(n)]


def given_values(options):
    """Those of `options` (name -> value) that were typed on the command line."""
    return {k: v for k, v in options.items() if _typed(k)}


def task_lengths(task, lengths):
    """Refuse, before any data is read, --lengths that task `task` cannot have: a length that
    does not fit it (click.BadParameter), or the default lengths, which are for noise, where the
    task has a fixed length (a click.UsageError saying which --lengths to give). A name that is no
    task is get_task's to refuse."""

    spec = TASKS.get(task)
    for T in lengths if spec else []:
        try:
            spec.shape(T)
        except ValueError as e:
            if given_flags("lengths"):
                raise click.BadParameter(str(e), param_hint="--lengths") from None
            natural = spec.shape()[0]
            raise click.UsageError(f"task {task!r} has a fixed length T = {natural}, and the "
                                   f"default --lengths {','.join(map(str, lengths))} are for "
                                   f"noise: give --lengths {natural}") from None


def check_simulation(figures):
    """`simulate`'s --figures name simulation figures, and --eps or --seed, where typed, is for
    one of them."""
    bad = [f for f in figures if f not in analysis.SIMULATION_FIGURES]
    if bad:
        raise click.BadParameter(f"no simulation figure {bad[0]}; choose from "
                                 f"{analysis.SIMULATION_FIGURES}", param_hint="--figures")
    for option in given_flags("eps", "seed"):
        takers = [n for n, used in analysis.FIGURE_SETTINGS.items() if option[2:] in used]
        if not set(takers) & set(figures):
            raise click.UsageError(f"{option} is for figures {', '.join(map(str, takers))}, and "
                                   f"none of --figures {','.join(map(str, figures))} uses it; "
                                   f"leave it out")


def check_jacobian(models, gammas, lengths, checkpoints, task, data_dir):
    """`jacobian`'s options agree: known --models; no option of the models at initialisation
    beside --checkpoint; no --input-size beside --task, no --data-dir without it; --gammas and
    --eps only for cells that have them; lengths that fit --task; gammas >= 0."""
    unknown = [m for m in models if m not in CELLS]
    if unknown:
        raise click.BadParameter(f"unknown model(s) {', '.join(unknown)}; choose from "
                                 f"{', '.join(CELLS)}", param_hint="--models")
    model_options = given_flags("models", "gammas", "hidden_size", "input_size", "eps", "sigma_w")
    if checkpoints and model_options:
        raise click.UsageError(f"--checkpoint takes the model from the checkpoint; leave out "
                               f"{', '.join(model_options)}")
    if task and "--input-size" in model_options:
        raise click.UsageError("--task sets the input size; leave out --input-size")
    if data_dir is not None and not task:
        raise click.UsageError("--data-dir is where --task's data is; without --task the inputs "
                               "are N(0, 1) noise")
    for option, hyper in (("--gammas", "gamma"), ("--eps", "eps")):
        if option in model_options and not any(hyper in CELLS[m].hyper for m in models):
            raise click.UsageError(f"{option} is for cells with {hyper}, and none of "
                                   f"{', '.join(models)} has one; leave it out")
    if any(T < 1 for T in lengths):
        raise click.BadParameter(f"lengths must be >= 1, got {lengths}", param_hint="--lengths")
    if task:
        task_lengths(task, lengths)
    if any(g < 0 for g in gammas):
        raise click.BadParameter(f"gammas must be >= 0, got {gammas}", param_hint="--gammas")


def bench_models(models):
    """The cells `bench` times for --model `models`: each once, in the order given, or every
    one for 'all' (which stands alone); an unknown name is refused."""
    models = list(dict.fromkeys(models))            # each once, in the order given
    if "all" in models and models != ["all"]:
        raise click.BadParameter(f"'all' stands alone, got {','.join(models)!r}",
                                 param_hint="--model")
    names = list(CELLS) if models == ["all"] else models
    unknown = [s for s in names if s not in CELLS]
    if unknown:
        raise click.BadParameter(f"unknown model(s) {', '.join(unknown)}; choose from "
                                 f"{', '.join(CELLS)} or 'all'", param_hint="--model")
    return names


# ----------------------------------------------------------------------------------------------
# options shared by several commands
# ----------------------------------------------------------------------------------------------

def run_options(command, defaults=None):
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
        aliases = (training.T_ALIAS,) if name == "T" else ()      # --seq-len's older name
        command = click.option(flag, *aliases, name, **kw)(command)
    return command


def seq_len_option(help):
    """--seq-len (also --T, its older name): a task's T, the `T` of the command."""
    return click.option(training.flag("T"), training.T_ALIAS, "T", default=None,
                        type=click.IntRange(min=1), help=help)


def run_task_options(command):
    """--task, --seq-len and --data-dir: what trained runs are fed (SavedRun.feed)."""
    for option in reversed([
            click.option("--task", default=None, help="Feed every run this task's test "
                         "sequences [default: each run's own task]."),
            seq_len_option("T of a noise-padded or synthetic task (copy: the delay) "
                           "[default: each run's]."),
            click.option("--data-dir", default=None, type=FOLDER,
                         help="Where the task's data is [default: each run's].")]):
        command = option(command)
    return command


def data_dir_option(f):
    return click.option("--data-dir", default=None, type=FOLDER,
                        help="Where raw files and caches are [default: $NPRNN_DATA_DIR, else "
                             "./data].")(f)


def task_choice(*extra):
    return click.Choice([*extra, *TASKS])


def perm_seed_option(f):
    return click.option("--perm-seed", default=0, show_default=True, type=SEED,
                        help="pmnist's permutation seed (other tasks ignore it).")(f)
