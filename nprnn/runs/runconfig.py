"""A run's settings, declared once (`OPTIONS`: default, range, help, whether --resume may change
it), checked (`resolve_config`, `merge_resume_config`), and turned into what the loop runs: the
task (`load_task`), the model (`build_model`), the optimizer (`build_optimizer`) and the learning
rate of each step (`lr_at`). cli.py's `train` and `sweep run` make their options from OPTIONS;
`train_command` writes a configuration back as a command line.
"""
import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import datasets, tasks
from ..core.cells import CELLS, INIT_SCHEMES, W_FORMS
from ..data.datasets import MAX_SEED
from ..core.device import DEVICES, resolve_device
from ..core.model import DTYPES, make_model
from ..core.optim import OPTIMIZERS, make_optimizer
from .runfolder import TrainError


@dataclass(frozen=True)
class Option:
    """One setting of a run, declared once: its default, the values it takes (`kind` "int",
    "float", "choice", "text", "folder" or "flag"; the bounds of a number, `above` meaning the
    lower bound itself is excluded, `below` the upper; the choices), whether --resume may change
    it, and its help. `resolve_config` checks numbers by it, and cli.py's `train` makes its
    command-line options from it."""
    default: object
    help: str
    kind: str = "int"
    minimum: float = None
    maximum: float = None
    above: bool = False
    below: bool = False
    choices: tuple = ()
    on_resume: bool = False
    note: str = ""                       # said after the allowed range in an error


# The cells' hyperparameters (cells.Hyper), each name once: eps, gamma (the Euler cells; gamma
# coRNN's too), dt (coRNN, LEM), epsilon (coRNN). A name is one option of a run and one key of
# its config.json whatever cell reads it; each cell has its own default and range for it, which
# make_model checks. coRNN's damping is `epsilon`, not `eps`: the Euler cells' eps is a step
# size (> 0, default 0.01), coRNN's epsilon a damping (>= 0, default 4.7), and one key must not
# mean both in a run's record.
HYPERPARAMETERS = tuple(dict.fromkeys(name for cell in CELLS.values() for name in cell.hyper))


def hyper_option(name):
    """The run option of the hyperparameter `name`: no default of its own (None: the model's),
    the loosest range any cell declares for it (make_model then checks the model's own), and a
    help saying what each cell means by it and its default."""
    specs = [cell.hyper[name] for cell in CELLS.values() if name in cell.hyper]
    helps = dict.fromkeys(f"{spec.help} [default: {spec.default:g}]." for spec in specs)
    low = min(spec.minimum for spec in specs)
    return Option(None, " ".join(helps), "float", minimum=low,
                  above=all(spec.above for spec in specs if spec.minimum == low))


# Everything a run is made of, in the order `train --help` lists it. None for a hyperparameter
# or T means "the model's / task's default"; the resolved values are written to config.json. What
# --resume may change: how long to run, how often to report, where the data is and runs, and
# the two knobs one turns after a divergence; anything else would make it a different run.
OPTIONS = dict(
    model=Option("antisym", "The recurrent cell (see `params`).", "choice",
                 choices=tuple(CELLS)),
    task=Option("mnist", f"{', '.join(tasks.TASKS)} (see nprnn/data/tasks.py).", "text"),
    pixels=Option("unit", "How a pixel p becomes an input: unit, p / 255 in [0, 1]; "
                          "standardised, (p / 255 - mean) / std per channel, the training "
                          "file's mean and std (the paper does not say).", "choice",
                  choices=tasks.PIXEL_SCALINGS),
    device=Option("cpu", "Where the kernels run.", "choice", choices=DEVICES, on_resume=True),
    hidden=Option(128, "Hidden units n.", minimum=1),
    layers=Option(1, "Stacked layers of the cell: layer l + 1 reads layer l's hidden sequence.",
                  minimum=1),
    **{name: hyper_option(name) for name in HYPERPARAMETERS},
    sigma_w=Option(1.0, "Recurrent init W ~ N(0, sigma_w^2 / n) (grid: 0, 1, 2, 4, 8, 16); "
                        "--init paper only. coRNN and LEM: the scale of their recurrent "
                        "matrices' official U(-1/sqrt(fan_in), 1/sqrt(fan_in)).", "float",
                   minimum=0),
    gate_bias=Option(0.0, "Start the gate bias b_z of antisym-gated, ablation and antisym-xgate "
                          "at this value (Appendix C: 0; 1 is a deviation from the paper).",
                     "float"),
    w_form=Option(None, "How antisym, antisym-gated and antisym-xgate hold W in A = W - W^T - "
                        "gamma I: triangle, strictly upper triangular (n(n-1)/2 parameters, the "
                        "paper's count); full, all n^2 (the paper's W_h in R^{n x n}, as public "
                        f"re-implementations hold it) [default: {W_FORMS[0]}].", "choice",
                  choices=W_FORMS),
    init=Option("paper", "Initialisation: Appendix C, or critical (LSTMs only).", "choice",
                choices=INIT_SCHEMES),
    optimizer=Option("sgd", "SGD with momentum, Adagrad, or Adam (the successors' papers).",
                     "choice",
                     choices=tuple(OPTIMIZERS)),
    lr=Option(0.1, "Learning rate (grid: 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1).", "float",
              minimum=0, above=True, on_resume=True),
    lr_decay_at=Option(None, "Multiply the learning rate by --lr-decay after each of these "
                             "iterations (ITER[,ITER...]; none by default: a constant lr).",
                       "iterations", on_resume=True),
    lr_decay=Option(0.1, "The factor of each --lr-decay-at.", "float", minimum=0, above=True,
                    on_resume=True),
    momentum=Option(0.9, "SGD momentum (adagrad has none: leave it out; the paper gives no "
                         "value).", "float", minimum=0, maximum=1, below=True),
    batch_size=Option(128, "Examples per step.", minimum=1),
    iterations=Option(50_000, "Training steps in all (a resumed run counts those already "
                              "done).", minimum=0, on_resume=True),
    clip=Option(0.0, "Clip the gradient to this global norm; 0 turns clipping off.", "float",
                minimum=0, on_resume=True, note=" (0 turns clipping off)"),
    seed=Option(0, "Seed of the initialisation, the data order and the training noise.",
                minimum=0, maximum=MAX_SEED),
    perm_seed=Option(0, "pmnist's pixel permutation (a seed other than 0 gets its own cache, "
                        "pmnist-seed<k>.h5); other tasks take none. Not --seed: runs with "
                        "different seeds are compared on the same task.",
                     minimum=0, maximum=MAX_SEED),
    eval_every=Option(1000, "Evaluate on the test split (or valid, with --valid-size) this "
                            "often.", minimum=1, on_resume=True),
    log_every=Option(100, "Write a training line (mean loss, accuracy) to metrics.jsonl this "
                          "often.", minimum=1, on_resume=True),
    checkpoint_every=Option(500, "Write runs/NAME/checkpoint.h5 this often (also at the end "
                                 "and on Ctrl-C).", minimum=1, on_resume=True),
    eval_batch_size=Option(256, "Examples per forward pass when evaluating.", minimum=1,
                           on_resume=True),
    dtype=Option("float32", "Precision of the kernels.", "choice", choices=DTYPES),
    data_dir=Option(None, "Where the task's raw files and cache are (nprnn.data.datasets' default "
                          "if left out).", "folder", on_resume=True),
    valid_size=Option(0, "Hold out this many training examples and evaluate on them during "
                         "training.", minimum=0),
    T=Option(None, "The task's T: the sequence length of adding and of the noise-padded tasks, "
                   "the delay of copy (whose sequences are T + 20 steps long).", minimum=1),
    keep_best=Option(False, "Also keep best.h5, the checkpoint of the best validation accuracy "
                            "so far (needs --valid-size; `eval` takes it).", "flag",
                     on_resume=True),
    tensorboard=Option(False, "Also write TensorBoard event files into the run folder (the "
                              "tensorboard extra): losses, accuracies, gradient norm, lr, the "
                              "recurrent matrix's eigenvalues. `tensorboard --logdir runs` "
                              "shows runs side by side.", "flag", on_resume=True),
)
DEFAULTS = {name: option.default for name, option in OPTIONS.items()}
CHANGEABLE_ON_RESUME = tuple(name for name, option in OPTIONS.items() if option.on_resume)

SWEEP_VALID_SIZE = 5000   # held out of the training set where a sweep does not say (nprnn/sweep/)


# T's option is --seq-len; --T, its older name, still works (nprnn/shell/options.py)
T_ALIAS = "--T"


def flag(name):
    """The `train` option of setting `name`: --sigma-w for sigma_w, --seq-len for T."""
    return "--seq-len" if name == "T" else "--" + name.replace("_", "-")


def train_command(config, out, always=()):
    """The `python cli.py train` line that starts a run of `config` (OPTIONS' names) in `out`:
    model, task and the settings named in `always` as they are, the others where they differ
    from the default."""
    words = ["python", "cli.py", "train"]
    for name, option in OPTIONS.items():
        value = config.get(name, option.default)
        if value is None or (value == option.default
                             and name not in ("model", "task", *always)):
            continue
        if option.kind == "flag":
            words.append(flag(name) if value else "--no-" + flag(name)[2:])
        elif option.kind == "iterations":
            words += [flag(name), ",".join(str(k) for k in value)]
        else:
            words += [flag(name), str(value)]
    return shlex.join(words + ["--out", str(out)])



# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------

def _int_option(config, key, minimum, maximum=None):
    v = config[key]
    if (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum
            or (maximum is not None and v > maximum)):
        allowed = f">= {minimum}" if maximum is None else f"in {minimum} .. {maximum}"
        raise TrainError(f"{key} must be an integer {allowed}, got {v!r}")
    config[key] = int(v)


def _float_option(config, key, option):
    """config[key] as a float in the option's range; TrainError naming the range if not."""
    v = config[key]
    try:
        v = float(v)
    except (TypeError, ValueError):
        v = float("nan")
    low, high = option.minimum, option.maximum
    ok = math.isfinite(v) and (low is None or (v > low if option.above else v >= low)) and (
        high is None or (v < high if option.below else v <= high))
    if not ok:
        if low is None and high is None:
            allowed = ""
        elif high is None:
            allowed = f" {'>' if option.above else '>='} {low:g}"
        else:
            allowed = (f" in {'(' if option.above else '['}{low:g}, {high:g}"
                       f"{')' if option.below else ']'}")
        raise TrainError(f"{key} must be a finite number{allowed}{option.note}, got "
                         f"{config[key]!r}")
    config[key] = v


def parse_iterations(key, v):
    """v (a list of iterations, or their text "8000,9000") as a sorted list of distinct ints
    >= 1; TrainError naming the bad entry if not."""
    items = (v.split(",") if v.strip() else []) if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)) or not items:
        raise TrainError(f"{key} must be one or more iterations (ITER[,ITER...]), got {v!r}")
    found = []
    for item in items:
        try:
            it = int(item.strip()) if isinstance(item, str) else item
        except ValueError:
            it = item
        if isinstance(it, (bool, np.bool_)) or not isinstance(it, (int, np.integer)) or it < 1:
            raise TrainError(f"{key} must list iterations, integers >= 1, got {item!r} in "
                             f"{v!r}")
        if int(it) in found:
            raise TrainError(f"{key} lists iteration {int(it)} twice in {v!r}")
        found.append(int(it))
    return sorted(found)


def lr_at(config, it):
    """The learning rate of the step from iteration `it` to it + 1: lr times lr_decay for each
    iteration of lr_decay_at that is <= it (a run saved before the schedule has none)."""
    decays = sum(1 for k in config.get("lr_decay_at") or () if k <= it)
    return config["lr"] * config.get("lr_decay", 0.1) ** decays


def resolve_config(**options):
    """DEFAULTS updated with `options`, checked. Unknown keys and out-of-range values raise
    TrainError naming the value and what is allowed. (The model and task check their own
    arguments when they are built.)"""
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise TrainError(f"unknown option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    config = dict(DEFAULTS, **options)
    for key, option in OPTIONS.items():
        if config[key] is None:                  # eps, gamma, T: the model's or task's own
            continue
        if option.kind == "int":
            _int_option(config, key, option.minimum, option.maximum)
        elif option.kind == "float":
            _float_option(config, key, option)
        elif option.kind == "flag":
            if not isinstance(config[key], (bool, np.bool_)):
                raise TrainError(f"{key} must be True or False, got {config[key]!r}")
            config[key] = bool(config[key])
        elif option.kind == "iterations":
            config[key] = parse_iterations(key, config[key])
    try:
        tasks.check_pixels(config["pixels"])
    except ValueError as e:
        raise TrainError(str(e)) from None
    if config["optimizer"] not in OPTIMIZERS:   # the other choices: the model and task say
        raise TrainError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                         f"{config['optimizer']!r}")
    if config["data_dir"] is not None:               # config.json stores it as a string
        if not isinstance(config["data_dir"], (str, os.PathLike)):
            raise TrainError(f"data_dir must be a path (str or os.PathLike) or None, got "
                             f"{config['data_dir']!r}")
        if str(config["data_dir"]).strip() == "":
            raise TrainError("data_dir is empty, which would mean the current folder; name a "
                             "folder, or leave it out for the default")
        # absolute: a run resumed or evaluated from another folder finds its data all the same
        config["data_dir"] = str(Path(config["data_dir"]).resolve())
    return config


def check_options_used(config):
    """A new run's option that would be recorded in config.json but change nothing is refused
    (as make_model refuses sigma_w with init 'critical'): momentum is SGD's alone, perm_seed
    seeds pmnist's permutation alone. (Only new runs: a saved run is resumed as it was.)"""
    if ("momentum" not in OPTIMIZERS[config["optimizer"]].options
            and config["momentum"] != DEFAULTS["momentum"]):
        raise TrainError(f"momentum = {config['momentum']!r} has no effect with optimizer "
                         f"{config['optimizer']!r} (momentum is SGD's): leave momentum at "
                         f"{DEFAULTS['momentum']}")
    if config["keep_best"] and config["valid_size"] == 0:
        raise TrainError("keep_best keeps the checkpoint of the best validation accuracy: give "
                         "valid_size > 0 (the test split is never used to choose)")
    if config["lr_decay_at"] is None and config["lr_decay"] != DEFAULTS["lr_decay"]:
        raise TrainError(f"lr_decay = {config['lr_decay']!r} has no effect without lr_decay_at "
                         f"(the iterations after which the lr is multiplied by it): give "
                         f"--lr-decay-at ITER[,ITER...], or leave lr_decay out")
    if config["task"] != "pmnist" and config["perm_seed"] != DEFAULTS["perm_seed"]:
        raise TrainError(f"perm_seed = {config['perm_seed']!r} has no effect on task "
                         f"{config['task']!r} (it seeds pmnist's pixel permutation): leave "
                         f"perm_seed at {DEFAULTS['perm_seed']}")


def _unused_options(config):
    """The options of `config` that its optimizer does not read (an Adagrad run's momentum)."""
    used = OPTIMIZERS[config["optimizer"]].options
    return [k for k in ("momentum",) if k in config and k not in used]


def merge_resume_config(saved, given):
    """The configuration of a resumed run: the saved one, with the options the user gave again.
    An option outside CHANGEABLE_ON_RESUME that differs from the saved value raises TrainError.
    Returns (config, changes) with changes a list of "key: old -> new" strings."""
    config, changes, conflicts = dict(saved), [], []
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise TrainError(f"unknown option {sorted(unknown)[0]!r}")
    # each given value as a new run would record it (a data_dir made absolute, a device
    # resolved), so that restating the saved value is no change
    normal = resolve_config(**given)
    if given.get("device") is not None:
        normal["device"] = resolve_device(given["device"])
    for key in given:
        value, old = normal[key], saved.get(key)
        if value == old or (key == "T" and old is None and value == saved.get("seq_len")):
            continue                   # the same value, or T restated at the task's default
        if key in CHANGEABLE_ON_RESUME:
            config[key] = value
            changes.append(f"{key}: {old!r} -> {value!r}")
        else:
            started = ("the task's own length" if key == "T" and old is None
                       else repr(old))
            conflicts.append(f"{flag(key)} {value!r} (the run was started with "
                             f"{started})")
    if conflicts:
        raise TrainError("--resume continues the saved run, whose settings cannot change: "
                         + "; ".join(conflicts) + ". Leave these options out, or start a new run "
                         "with another --out. Options that may change on resume: "
                         + ", ".join(flag(k) for k in CHANGEABLE_ON_RESUME))
    return resolve_config(**{k: v for k, v in config.items() if k in DEFAULTS}) | {
        k: v for k, v in config.items() if k not in DEFAULTS}, changes


def _data_dir_resolved(changes, data_dir):
    """A resume's changes as said once the data folder is resolved: "data_dir: old -> None" (a
    sweep trial taken back to the default folder) names the folder, or goes where that is
    the old one."""
    said = []
    for change in changes:
        if change.startswith("data_dir: ") and change.endswith(" -> None"):
            old = change[len("data_dir: "):-len(" -> None")]
            if old == repr(data_dir):
                continue
            change = f"data_dir: {old} -> {data_dir!r}"
        said.append(change)
    return said


def load_task(config, task=None):
    """The task a configuration names (nprnn.data.datasets.get_task), or `task` if one is given
    (tests and notebooks pass in-memory tasks). The training seed is not the task's: pmnist's
    permutation comes from perm_seed, so runs with different seeds see the same task. (Runs saved
    before perm_seed existed have none in their config.json: they used the permutation of 0,
    and unit pixels.) An in-memory task's x is used as it is: it takes no `pixels` but "unit"."""
    pixels = config.get("pixels", "unit")
    if task is not None:
        if pixels != "unit":
            raise TrainError(f"pixels = {pixels!r} scales a named task's images; the in-memory "
                             f"task {task.name!r} gives its x as it is: leave pixels at 'unit'")
        return task
    return datasets.get_task(config["task"], data_dir=config["data_dir"], T=config["T"],
                             seed=config.get("perm_seed", 0), valid_size=config["valid_size"],
                             pixels=pixels)


def task_head(task):
    """What a task declares of the model that learns it, recorded in config.json: the readout
    ("last", "every"), the loss ("xent", "mse") and the metric ("accuracy", "mse")."""
    return dict(readout=task.readout, loss=task.loss, metric=task.metric)


def build_model(config, input_size, num_classes):
    """The model a configuration names, for inputs of size m = input_size and K = num_classes,
    with the config's layers, readout and loss (runs saved before them: 1, "last", "xent")."""
    return make_model(config["model"], input_size=input_size, hidden_size=config["hidden"],
                      num_classes=num_classes, layers=config.get("layers", 1),
                      readout=config.get("readout", "last"), loss=config.get("loss", "xent"),
                      **{k: config.get(k) for k in HYPERPARAMETERS},   # (before dt: None)
                      sigma_w=config["sigma_w"], init=config["init"], seed=config["seed"],
                      dtype=config["dtype"], device=config["device"],
                      gate_bias=config.get("gate_bias", 0.0),      # (runs saved before it: 0)
                      w_form=config.get("w_form"))                 # (before it: the default)


def build_optimizer(config, params):
    cls = OPTIMIZERS[config["optimizer"]]
    return make_optimizer(config["optimizer"], params, config["lr"],
                          **{k: config[k] for k in cls.options})


def check_task_fits(model, trained, task, source):
    """A task whose input size, number of classes (outputs), readout or loss differs from those
    of the model (built from the config `trained`) cannot be used."""
    _check_fits(model, trained, task.name, task.m, task.num_classes, task_head(task), source)


def check_named_task_fits(model, trained, config, source):
    """check_task_fits for the task that config["task"] and config["T"] name, from its spec
    alone: a task that does not fit is refused before its data is fetched or cached."""
    spec = tasks.task_spec(config["task"])
    _check_fits(model, trained, spec.name, spec.shape(config["T"])[1], spec.num_classes,
                task_head(spec), source)


def _check_fits(model, trained, name, m, num_classes, head, source):
    have = dict(readout=trained.get("readout", "last"), loss=trained.get("loss", "xent"))
    if m != model.input_size or num_classes != model.num_classes:
        raise TrainError(f"task {name!r} (input size m={m}, {num_classes} classes) does not "
                         f"fit the model in {source} (m={model.input_size}, "
                         f"{model.num_classes} classes)")
    for key in have:
        if head[key] != have[key]:
            raise TrainError(f"task {name!r} ({key} {head[key]!r}) does not fit the model in "
                             f"{source} ({key} {have[key]!r})")
