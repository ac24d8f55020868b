"""The training loop: batches, steps, clipping, evaluation, metrics, checkpoints, resume, signals.

One iteration is one minibatch step (Appendix C counts 50,000 of them, batch size 128):

    x, y      = the next training batch (B, T, m), (B,)      in the order the task draws from
                                                              (seed, epoch): see nprnn/datasets.py
    L, g      = model.loss_and_grad(x, y)                     full BPTT
    s         = min(1, clip / ||g||)                          gradient-norm clipping (0: s = 1)
    params   <- optimizer step with s g                       SGD with momentum or Adagrad

A run lives in a folder, runs/NAME/:

    config.json      the resolved configuration: model, task, every hyperparameter (what
                     `python cli.py eval` needs to rebuild the model and the task)
    metrics.jsonl    one JSON object per line: {"iteration", "split", "loss", "accuracy", ...};
                     split "train" for each logging interval (means over its steps, plus "lr",
                     "grad_norm", "time", "it_per_s"), "valid"/"test" for each evaluation.
                     "time" is the run's wall time so far (all its pieces, evaluations and
                     checkpoints included); "it_per_s" is iteration / time, not the interval's
    checkpoint.h5    the latest checkpoint (nprnn/checkpoint.py): parameters, optimizer state,
                     the iteration, the position in the data order, wall time so far

One process at a time trains in a folder: it holds an OS lock on runs/NAME/.lock for its life
(released when it ends, however it ends), and a second one is refused, naming the first. A new
run that fails before its first step (out of memory, say) leaves nothing behind.

Nothing is lost:
  * a checkpoint is written at iteration 0, every `checkpoint_every` iterations, at the end, and
    when SIGINT (Ctrl-C) or SIGTERM arrives (the current step finishes first); writes are atomic;
  * `resume=True` restores everything and continues: the batches after iteration i are the ones
    an uninterrupted run would have seen (epoch = i // batches_per_epoch, batch = i mod it), the
    optimizer state is the saved one, so on the CPU the parameters are bit-identical to an
    uninterrupted run's. metrics.jsonl is cut back to the checkpoint's iteration first, so lines
    written after the last checkpoint by a killed process are not duplicated;
  * random numbers: the model's initialisation is drawn from `seed`; during training the only
    random draws are the data order (and the noise of the noise tasks), which nprnn.datasets
    derives from (seed, epoch, batch index), and epoch and batch follow from the iteration. So
    the seed and the checkpoint's iteration are the complete random state of a run, given the
    same NumPy: the order comes from NumPy's random Generator, whose streams NumPy does not
    promise to keep across versions. The checkpoint records the version, and resuming under
    another one says so;
  * a NaN or Inf in the loss or the gradient stops the run before the bad step is applied and
    leaves the last good checkpoint in place (TrainingDiverged names the iteration).
"""
import fcntl
import json
import math
import os
import shlex
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import autotune, datasets
from .cells import CELLS, INIT_SCHEMES, W_FORMS
from .checkpoint import (FILENAME, CheckpointError, load_checkpoint, load_params_into,
                         read_config_json, save_checkpoint)
from .datasets import MAX_SEED, resolve_data_dir
from .device import DEVICES, cpu_model, resolve_device
from .files import written_atomically
from .kernels.gpu_common import to_host
from .memory import Staging
from .model import DTYPES, make_model
from .optim import OPTIMIZERS, StepRecorder, make_optimizer
from .progress import TrainingBar


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


# Everything a run is made of, in the order `train --help` lists it. None for eps / gamma / T
# means "the model's / task's default"; the resolved values are written to config.json. What
# --resume may change: how long to run, how often to report, where the data is and runs, and
# the two knobs one turns after a divergence; anything else would make it a different run.
OPTIONS = dict(
    model=Option("antisym", "The recurrent cell (see `params`).", "choice",
                 choices=tuple(CELLS)),
    task=Option("mnist", "mnist, pmnist, cifar10, cifar10-noise, padded-mnist, mnist-noise, "
                         "fashion-mnist, mnist-sample (see nprnn/datasets.py).", "text"),
    pixels=Option("unit", "How a pixel p becomes an input: unit, p / 255 in [0, 1]; "
                          "standardised, (p / 255 - mean) / std per channel, the training "
                          "file's mean and std (the paper does not say).", "choice",
                  choices=datasets.PIXEL_SCALINGS),
    device=Option("cpu", "Where the kernels run.", "choice", choices=DEVICES, on_resume=True),
    hidden=Option(128, "Hidden units n.", minimum=1),
    eps=Option(None, "Step size eps of the Euler cells (Appendix C grid: 0.01, 0.1, 1) "
                     "[default: 0.01].", "float", minimum=0, above=True),
    gamma=Option(None, "Diffusion gamma (grid: 0.001, 0.01, 0.1, 1) [default: 0.01].", "float",
                 minimum=0),
    sigma_w=Option(1.0, "Recurrent init W ~ N(0, sigma_w^2 / n) (grid: 0, 1, 2, 4, 8, 16); "
                        "--init paper only.", "float", minimum=0),
    gate_bias=Option(0.0, "Start the gate bias b_z of antisym-gated, ablation and antisym-xgate "
                          "at this value (Appendix C: 0; 1 is a deviation from the paper).",
                     "float"),
    w_form=Option(None, "How antisym, antisym-gated and antisym-xgate hold W in A = W - W^T - "
                        "gamma I: triangle, strictly upper triangular (n(n-1)/2 parameters, the "
                        "paper's count); full, all n^2 (the paper's W_h in R^{n x n}, as public "
                        "re-implementations hold it) [default: triangle].", "choice",
                  choices=W_FORMS),
    init=Option("paper", "Initialisation: Appendix C, or critical (LSTMs only).", "choice",
                choices=INIT_SCHEMES),
    optimizer=Option("sgd", "SGD with momentum, or Adagrad.", "choice",
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
    data_dir=Option(None, "Where the task's raw files and cache are (nprnn.datasets' default "
                          "if left out).", "folder", on_resume=True),
    valid_size=Option(0, "Hold out this many training examples and evaluate on them during "
                         "training.", minimum=0),
    T=Option(None, "Sequence length of the noise-padded tasks.", minimum=1),
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

SWEEP_VALID_SIZE = 5000   # held out of the training set where a sweep's runs do not say (sweep.py)

METRICS = "metrics.jsonl"
CONFIG = "config.json"
BEST = "best.h5"
LOCK = ".lock"


def flag(name):
    """The `train` option of setting `name`: --sigma-w for sigma_w, --T for T."""
    return "--T" if name == "T" else "--" + name.replace("_", "-")


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


class TrainError(Exception):
    """A run that cannot start or continue as asked (bad options, folder already used, ...)."""


class TrainingDiverged(TrainError):
    """The loss or the gradient became NaN or Inf."""


class RunInUse(TrainError):
    """Another process is training in the run folder (it holds the folder's lock)."""


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
        datasets.check_pixels(config["pixels"])
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
    """The task a configuration names (nprnn.datasets.get_task), or `task` if one is given
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


def build_model(config, input_size, num_classes):
    """The model a configuration names, for inputs of size m = input_size and K = num_classes."""
    return make_model(config["model"], input_size=input_size, hidden_size=config["hidden"],
                      num_classes=num_classes, eps=config["eps"], gamma=config["gamma"],
                      sigma_w=config["sigma_w"], init=config["init"], seed=config["seed"],
                      dtype=config["dtype"], device=config["device"],
                      gate_bias=config.get("gate_bias", 0.0),      # (runs saved before it: 0)
                      w_form=config.get("w_form"))                 # (before it: the default)


def build_optimizer(config, params):
    cls = OPTIMIZERS[config["optimizer"]]
    return make_optimizer(config["optimizer"], params, config["lr"],
                          **{k: config[k] for k in cls.options})


def check_task_fits(model, task, source):
    """A task whose input size or number of classes differs from the model's cannot be used."""
    _check_fits(model, task.name, task.m, task.num_classes, source)


def check_named_task_fits(model, config, source):
    """check_task_fits for the task that config["task"] and config["T"] name, from its spec
    alone: a task that does not fit is refused before its data is fetched or cached."""
    spec = datasets.task_spec(config["task"])
    _check_fits(model, spec.name, spec.shape(config["T"])[1], spec.num_classes, source)


def _check_fits(model, name, m, num_classes, source):
    if m != model.input_size or num_classes != model.num_classes:
        raise TrainError(f"task {name!r} (input size m={m}, {num_classes} classes) does not "
                         f"fit the model in {source} (m={model.input_size}, "
                         f"{model.num_classes} classes)")


# ----------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------

def cross_entropy(logits, y):
    """Per-example softmax cross-entropy -log p[b, y_b] (B,) in float64, and the predictions."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(z).sum(axis=1))
    return log_norm - z[np.arange(len(y)), y], z.argmax(axis=1)


def evaluate(model, task, split, batch_size=256, should_stop=None, progress=None, staging=None):
    """Mean loss and accuracy of `model` over every example of a split, in a fixed order (the
    training split too: unshuffled, its last short batch kept), whatever the batch size.

    Returns dict(loss, accuracy, count), or None if `should_stop()` became true in between
    (a stop signal during a long evaluation does not wait for it to finish). `progress`, if
    given, is called as progress(examples done, examples in all) after each batch. On cuda the
    batches go through `staging` (an nprnn.memory.Staging that the caller keeps from one
    evaluation to the next), else through buffers of their own."""
    if task.size(split) == 0:
        if split == "valid":
            raise TrainError(f"task {task.name!r} has no validation split: it is held out of the "
                             f"training set with --valid-size N when training starts")
        raise TrainError(f"split {split!r} of task {task.name!r} is empty")
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in task.batches(split, batch_size, shuffle=False, drop_last=False,
                             device=model.device, reuse=_reuse(model, staging)):
        if should_stop is not None and should_stop():
            return None
        losses, pred = cross_entropy(model.forward(x), y)
        loss_sum += float(losses.sum())
        correct += int((pred == y).sum())
        count += len(y)
        if progress is not None:
            progress(count, task.size(split))
    return dict(loss=loss_sum / count, accuracy=correct / count, count=count)


def _reuse(model, staging):
    """Task.batches' `reuse` for a model: on cuda, `staging` if given, else buffers of the
    pass's own; on the CPU, none."""
    if model.device != "cuda":
        return False
    return True if staging is None else staging


# ----------------------------------------------------------------------------------------------
# The run folder: metrics log and signals
# ----------------------------------------------------------------------------------------------

class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl, flushed at once.

    A resumed run's log continues exactly where its checkpoint stands. Each checkpoint records
    the log's length (`length()`), and opened with `keep_bytes=n` the log is cut back to those n
    bytes: what follows was logged after the checkpoint, by steps and evaluations that the
    resumed run does again (an evaluation at the checkpoint's own iteration among them, when the
    process died while saving after it). A checkpoint written before there was such a length
    gives `keep_until=i` instead: the lines of iterations after i are dropped, and a torn last
    line."""

    def __init__(self, path, keep_until=None, keep_bytes=None, tensorboard=None):
        self.path, self.tensorboard = Path(path), tensorboard
        if keep_bytes is not None and self.path.exists():
            if self.path.stat().st_size > keep_bytes:
                os.truncate(self.path, keep_bytes)
        elif keep_until is not None and self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and rec.get("iteration", 0) <= keep_until:
                    kept.append(line)
            with written_atomically(self.path) as tmp:
                tmp.write_text("".join(line + "\n" for line in kept))
        self.file = open(self.path, "a")

    def write(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def length(self):
        """The log's length in bytes, once what was written is on disk (a checkpoint that
        records it must not get there first)."""
        try:
            os.fsync(self.file.fileno())
        except OSError:                 # not a regular file (/dev/null, a pipe): nothing to sync
            pass
        return os.fstat(self.file.fileno()).st_size

    def close(self):
        self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


class TensorBoardLog:
    """metrics.jsonl's records mirrored as TensorBoard scalars (split/loss, split/accuracy,
    train/grad_norm, train/lr) in the run folder, so that runs, seeds and a sweep's trials open
    side by side (`tensorboard --logdir runs`); for the Euler cells, at each logging interval,
    histograms of the recurrent matrix's eigenvalues (real parts and moduli: an n x n eigvals,
    cheap beside an interval of steps). tensorboardX writes the event files (the tensorboard
    extra); metrics.jsonl stays the record."""

    SCALARS = ("loss", "accuracy", "grad_norm", "lr")

    def __init__(self, out, model):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise TrainError("--tensorboard needs the tensorboard extra: pip install -e "
                             "'.[tensorboard]'") from None
        self.writer, self.model = SummaryWriter(logdir=str(out)), model

    def write(self, record):
        it, split = record["iteration"], record["split"]
        for key in self.SCALARS:
            if record.get(key) is not None and math.isfinite(record[key]):
                self.writer.add_scalar(f"{split}/{key}", record[key], it)
        if split == "train" and hasattr(self.model.cell, "matrix"):
            W = to_host(self.model.params["W"]).astype(np.float64)
            A = self.model.cell.matrix(W, self.model.hyper.get("gamma", 0.0))
            eigenvalues = np.linalg.eigvals(A)
            self.writer.add_histogram("recurrent_eigenvalues/real", eigenvalues.real, it)
            self.writer.add_histogram("recurrent_eigenvalues/modulus", np.abs(eigenvalues), it)
        self.writer.flush()

    def close(self):
        self.writer.close()


class SecondSignal(KeyboardInterrupt):
    """A second SIGINT or SIGTERM while a run was finishing its step: abort at once. `name` is
    the signal's ("SIGINT", "SIGTERM")."""

    def __init__(self, name):
        super().__init__(f"second {name}: aborted")
        self.name = name


class StopSignals:
    """While active, SIGINT and SIGTERM only set `requested` (the signal's name): the loop finishes
    its step, checkpoints, and returns. A second signal aborts at once (KeyboardInterrupt), which
    is still safe: checkpoints are atomic. Signal handlers exist only in the main thread; in any
    other thread this does nothing.

    The handler writes nothing: it runs between two bytecodes of the main thread, perhaps inside
    a write to the very stream it would print on, and a buffered stream refuses such a nested
    write ("RuntimeError: reentrant call"). The loop asks `stopping()` instead, whose first answer
    after a signal says what will happen."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, echo, asked=None):
        self.echo = echo
        self.asked = asked                 # a callable: why to stop (a few words), or None
        self.requested = None
        self.announced = False
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.requested is not None:
            raise SecondSignal(signal.Signals(signum).name)
        self.requested = signal.Signals(signum).name

    def stopping(self):
        """The name of the signal that asked to stop (or what `asked` said), or None."""
        if self.requested is None and self.asked is not None:
            self.requested = self.asked()
            if self.requested is not None:
                self.announced = True
                self.echo(f"stop asked ({self.requested}): writing a checkpoint")
        if self.requested is not None and not self.announced:
            self.announced = True
            self.echo(f"{self.requested} received: finishing this step, then writing a "
                      f"checkpoint (send it again to abort at once)")
        return self.requested

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        return False


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------

def _new_interval():
    return dict(steps=0, count=0, correct=0, loss_sum=0.0, grad_norm_sum=0.0)


def _diverged(acc_run, it, saved_at, ckpt_path, config, out):
    """TrainingDiverged for the first step whose loss or gradient was not finite. `acc_run` is
    StepRecorder.read() at iteration `it`; that step and any after it were not applied."""
    bad_it = it - acc_run["steps"] + acc_run["first_bad"]
    loss, norm = acc_run["bad_loss"], acc_run["bad_norm"]
    return TrainingDiverged(
        f"the {'loss' if not math.isfinite(loss) else 'gradient'} is not finite at iteration "
        f"{bad_it} (loss {loss}, gradient norm {norm}); training stopped before applying that "
        f"step. The last good checkpoint (iteration {saved_at}) is kept in {ckpt_path}. Try a "
        f"lower learning rate (now {config['lr']:g}) or gradient clipping, e.g.: python cli.py "
        f"train --out {out} --resume --lr {config['lr'] / 2:g} --clip 1")


def _arithmetic():
    """What a step's bits depend on besides the run's settings, its data and NumPy: numba (the
    code LLVM makes of the kernels), scipy (the BLAS the CPU kernels call) and the CPU (which
    code paths both pick). Recorded in the checkpoint; a resume where one differs says so."""
    import numba
    import scipy
    return dict(numba=numba.__version__, scipy=scipy.__version__, cpu=cpu_model())


def _write_json(path, obj):
    with written_atomically(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def format_config(config, model):
    """The resolved configuration as aligned 'key  value' lines, the parameter count and, on
    cuda, the kernels each pass runs."""
    keys = ["model", "task", "pixels", "seq_len", "hidden", "eps", "gamma", "sigma_w",
            "gate_bias", "w_form", "init",
            "optimizer", "lr", "lr_decay_at", "lr_decay", "momentum", "clip", "batch_size", "iterations", "seed", "perm_seed",
            "dtype", "device", "eval_every", "eval_split", "log_every", "checkpoint_every",
            "data_dir", "valid_size"]
    lines = [f"  {k:<17} {config.get(k)}" for k in keys
             if not (k == "momentum" and k not in OPTIMIZERS[config["optimizer"]].options)
             and not (k == "perm_seed" and config["task"] != "pmnist")
             and not (k == "gate_bias" and "b_z" not in model.params)
             and not (k == "w_form" and config.get(k) is None)
             and not (k == "lr_decay" and not config.get("lr_decay_at"))]
    lines.append(f"  {'parameters':<17} {model.num_params():,}")
    if model.device == "cuda":      # which GPU kernels run (nprnn/autotune.py times them once)
        choice = model.kernels_for(config["batch_size"], config["seq_len"])
        lines.append(f"  {'kernels':<17} {choice}")
    return "\n".join(lines)


def train(config=None, out="runs/run", resume=False, given=None, task=None, echo=print,
          progress=True, callback=None, allow_lost_log=False, should_stop=None,
          on_evaluation=None):
    """Train (or, with resume=True, continue) the run in folder `out`. Returns a summary dict:
    iteration, completed (bool), stopped (signal name or None), final (the final test metrics or
    None), elapsed (wall seconds of training so far), out.

    config:   a dict for resolve_config (a new run); ignored on resume, where the saved one is
              used with the options in `given` applied (merge_resume_config)
    task:     an in-memory task to use instead of nprnn.datasets.get_task(config["task"], ...)
    echo:     prints the messages (the configuration, evaluations, the end)
    progress: show the progress bar on stderr
    callback: called as callback(iteration, loss) after every step (tests use it to interrupt)
    should_stop: asked after every step; what it returns other than None (a few words) stops
              the run as a signal does: a checkpoint, then `stopped` is those words
    on_evaluation: called as on_evaluation(iteration, split, metrics) after each evaluation
    allow_lost_log: resume even where metrics.jsonl is missing or shorter than the checkpoint
              recorded (its curves up to the checkpoint are then lost)
    """
    out = _run_folder(out)
    made = not out.exists()
    created, run = [], None                    # the files this run made, the run
    with RunLock(out):
        try:
            run = Run(config, out, resume, given, task, echo, progress, allow_lost_log, created)
            run.on_evaluation = on_evaluation
            return _train(run, callback, should_stop)
        except Exception as e:
            trained = run is not None and run.it > 0
            if not trained and not isinstance(e, TrainingDiverged):
                _remove_new_run(out, created, made)     # it never trained: nothing to keep
            raise


def _train(run, callback, should_stop=None):
    """The loop of `train`, over an opened Run; returns train's summary."""
    echo, out = run.echo, run.out
    try:
        with StopSignals(run.bar.message, should_stop) as stop:
            run.begin(stop)
            while run.it < run.total and stop.stopping() is None:
                for x, y in run.batches():            # the rest of this epoch, in its order
                    run.step(x, y)                    # forward, full BPTT, optimizer step
                    run.report(stop, callback)        # log, evaluate, checkpoint when due
                    if run.it >= run.total or stop.stopping() is not None:
                        break
            final, stopped = run.finish(stop)
    finally:
        run.close()
    it, ckpt_path = run.it, run.ckpt_path
    if stopped:
        echo(f"stopped by {stopped} at iteration {it}; checkpoint saved to {ckpt_path}. "
             f"Continue with: python cli.py train --out {out} --resume")
    elif final is not None:
        echo(f"final test accuracy after {it} iterations: {final['accuracy']:.4f} "
             f"(loss {final['loss']:.4f}, {run.prog['elapsed']:.0f} s of training)")
    return dict(iteration=it, completed=it >= run.total and not stopped, stopped=stopped,
                final=final, elapsed=run.prog["elapsed"], out=str(out))


def _run_folder(out):
    """`out` as a Path; an empty one (the current folder, perhaps the sources) is refused."""
    if str(out).strip() == "":
        raise TrainError("the run folder (--out) is empty, which would mean the current folder; "
                         "name a folder for the run, e.g. runs/NAME")
    return Path(out)


def _remove_new_run(out, created, made):
    """Remove what a run that failed before its first step made: the files in `created` (a new
    run's config.json, metrics.jsonl and checkpoint), and the folder with its lock file where
    the run made the folder."""
    for path in created:
        path.unlink(missing_ok=True)
    if made:
        (out / LOCK).unlink(missing_ok=True)
        try:
            out.rmdir()
        except OSError:                        # something else is in it: leave it
            pass


class RunLock:
    """An exclusive OS lock (flock) on the run folder's .lock file for the life of a training
    process: the system releases it when the process ends, by a crash or kill -9 too, so a lock
    is never stale. The file says which process holds it; a second process is refused, named."""

    def __init__(self, out):
        self.out, self.path, self.file = out, out / LOCK, None

    def __enter__(self):
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a+")
        except OSError as e:
            raise TrainError(f"cannot create the run folder {self.out}: "
                             f"{e.strerror or e}") from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise RunInUse(f"{self.out} is in use: {holder} is training there. Wait for it "
                             f"to end, or choose another --out") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"process {os.getpid()} on {socket.gethostname()} since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self.file.flush()
        return self

    def __exit__(self, *exc):
        self.file.close()                      # closing releases the lock


class Run:
    """A training run in its folder: its configuration, model, optimizer, task, progress and
    files, and the parts of `train`'s loop. Opening it (the constructor) checks everything a
    run needs before any work (a new folder or a checkpoint to resume, the task, the device),
    writes config.json and prints the configuration."""

    def __init__(self, config, out, resume, given, task, echo, progress, allow_lost_log=False,
                 created=None):
        self.out, self.resume, self.echo, self._progress = out, resume, echo, progress
        self.allow_lost_log = allow_lost_log
        self.created = [] if created is None else created   # the files a new run made
        self.ckpt_path = ckpt_path = out / FILENAME
        if resume:
            if not ckpt_path.is_file():
                raise TrainError(f"nothing to resume: {ckpt_path} does not exist (start the run "
                                 f"without --resume first)")
            saved = load_checkpoint(ckpt_path)
            config, changes = merge_resume_config(saved["config"], given or {})
        else:
            if ckpt_path.exists():
                raise TrainError(f"{out} already holds a run; continue it with --resume, or "
                                 f"choose another --out")
            # a new run writes these two; left from a run that stopped before its first
            # checkpoint, or from something else, they would be overwritten (config.json) or
            # mixed into the new run's curves (metrics.jsonl, which a run appends to; one linked
            # to /dev/null is kept)
            metrics = out / METRICS
            found = [CONFIG] if (out / CONFIG).exists() else []
            if metrics.is_file() and metrics.stat().st_size > 0:
                found.append(METRICS)
            if found:
                raise TrainError(f"{out} holds {' and '.join(found)} but no {FILENAME}, so there "
                                 f"is no run to resume there. Delete {' and '.join(found)} to "
                                 f"start a run in {out}, or choose another --out")
            config, changes = resolve_config(**(config or {})), []
        self.changes = changes

        if task is not None:
            config["task"] = task.name
        else:
            # the data folder the run uses, recorded absolute even when it came from the default
            # ($NPRNN_DATA_DIR or ./data), so that a resume or an eval elsewhere finds the same
            config["data_dir"] = str(resolve_data_dir(config["data_dir"]).resolve())
            self.changes = _data_dir_resolved(self.changes, config["data_dir"])
        if not resume:
            check_options_used(config)
        for key in _unused_options(config):   # config.json records only what applies
            config.pop(key)
        # "auto" recorded as the device it chose; no GPU for --device cuda: said before any work
        config["device"] = resolve_device(config["device"])
        self.owns_task = task is None          # then close it at the end (a CachedTask's file)
        self.task = task = load_task(config, task)
        try:
            self._build(config, saved if resume else None)
        except BaseException:
            self._close_task()
            raise

    def _build(self, config, saved):
        out, task, resume, echo = self.out, self.task, self.resume, self.echo
        if resume:
            model = build_model(config, config["input_size"], config["num_classes"])
            check_task_fits(model, task, f"checkpoint {self.ckpt_path}")
            load_params_into(model, saved["params"], f"checkpoint {self.ckpt_path}")
        else:
            model = build_model(config, task.m, task.num_classes)
        optimizer = build_optimizer(config, model.params)
        if resume:
            try:
                optimizer.load_state_dict(saved["optimizer"])
            except ValueError as e:
                raise CheckpointError(f"checkpoint {self.ckpt_path}: {e}") from None

        # the resolved configuration: every default made explicit, as config.json records it
        eval_split = "valid" if config["valid_size"] > 0 else "test"
        config.update(eps=model.hyper.get("eps"), gamma=model.hyper.get("gamma"),
                      w_form=model.cell.w_form, seq_len=task.T,
                      input_size=task.m, num_classes=task.num_classes,
                      num_params=model.num_params(), eval_split=eval_split)
        B, total = config["batch_size"], config["iterations"]
        per_epoch = task.num_batches("train", B)
        if per_epoch == 0:
            raise TrainError(f"the training split of {task.name!r} has {task.size('train')} "
                             f"examples, fewer than one batch of {B}; lower --batch-size")
        config["batches_per_epoch"] = per_epoch

        if resume:
            prog = saved["progress"]
            if total < prog["iteration"]:
                raise TrainError(f"the run in {out} is already at iteration {prog['iteration']}; "
                                 f"--iterations must be at least that, got {total}")
            if prog["batches_per_epoch"] != per_epoch:
                raise TrainError(f"the task now has {per_epoch} batches per epoch, the checkpoint "
                                 f"was written with {prog['batches_per_epoch']}: the training set "
                                 f"changed (another --data-dir, or other files in it?)")
            self._check_log(prog)
            for c in self.changes:            # said once the changes are known to hold
                echo(f"resume: {c}")
        else:
            prog = dict(iteration=0, epoch=0, batch=0, batches_per_epoch=per_epoch, elapsed=0.0,
                        evaluated={}, interval=_new_interval())
        if not resume:
            self.created += [out / name for name in (CONFIG, METRICS, FILENAME)
                             if not (out / name).exists()]
        _write_json(out / CONFIG, config)

        arithmetic = _arithmetic()           # what this process's steps run with
        echo(("resuming" if resume else "training") + f" {model.name} on {task.name} in {out}")
        echo(format_config(config, model))
        if resume:
            _say_what_changed(prog, arithmetic, echo)
        prog["numpy"] = np.__version__        # the NumPy whose Generator draws the data order
        prog["arithmetic"] = arithmetic
        seconds = _warm_up(config, model, task)
        echo(f"compiling kernels ... {seconds:.1f} s (loaded from numba's cache once compiled; "
             f"not counted as training time)")

        self.config, self.model, self.optimizer, self.prog = config, model, optimizer, prog
        self.it, self.total, self.per_epoch = prog["iteration"], total, per_epoch
        self.eval_split = eval_split
        self.saved_at = prog["iteration"]     # the iteration of the checkpoint on disk
        # The interval's running loss, accuracy and gradient norm are summed where the step runs
        # (StepRecorder). Reading them is the one wait for a GPU, done only by sync(): when the
        # loop reports, evaluates, saves or stops, and after every step on the CPU, where it
        # costs nothing and a divergence stops the run at once.
        self.recorder = StepRecorder(model.device, config["clip"], prog["interval"])
        # on cuda, every epoch and evaluation of the run fills the same few batch buffers
        # (page-locked ones among them, slow to allocate, and freed only by a wait for the GPU)
        self.staging = Staging() if model.device == "cuda" else None
        tensorboard = TensorBoardLog(out, model) if config["tensorboard"] else None
        self.log = MetricsLog(out / METRICS, keep_until=prog["iteration"] if resume else None,
                              keep_bytes=prog.get("metrics_bytes") if resume else None,
                              tensorboard=tensorboard)
        self.bar = TrainingBar(total, prog["iteration"], enabled=self._progress, echo=echo)
        self.run_loss = self.run_acc = float("nan")
        self.on_evaluation = None            # train's hook, called after each evaluation
        self._t_start, self._elapsed0 = time.perf_counter(), prog["elapsed"]

    def _check_log(self, prog):
        """On resume: metrics.jsonl holds at least what the checkpoint recorded of it, or the
        user said to go on without it (its curves up to the checkpoint are lost then)."""
        kept = prog.get("metrics_bytes")
        path = self.out / METRICS
        if kept is None or self.allow_lost_log:
            return
        have = path.stat().st_size if path.is_file() else None
        if have is None or have < kept:
            what = "is missing" if have is None else f"holds {have:,} bytes"
            raise TrainError(f"{path} {what}, but the checkpoint of iteration "
                             f"{prog['iteration']} recorded {kept:,} bytes of it: the run's "
                             f"curves so far would be lost. Put the file back, or resume with "
                             f"--allow-lost-log to go on without them")

    # -- the parts of the loop ------------------------------------------------------------------
    def begin(self, stop):
        """The iteration-0 checkpoint (a run folder always has one; a resume that changed options
        says so in its checkpoint at once), and an evaluation that a stop signal cut short, done
        now and saved as done (metrics.jsonl keeps the lines at the checkpoint's iteration, so a
        later resume from the same checkpoint would log it again)."""
        if not self.resume or self.changes:
            self.checkpoint()
        if self.eval_due(self.it) and self.prog["evaluated"].get(self.eval_split) != self.it:
            if self.evaluate(self.eval_split, stop):
                self.prog["elapsed"] = self.elapsed()
                self.checkpoint()

    def batches(self):
        """The training batches from the current iteration to the end of its epoch."""
        epoch, start = divmod(self.it, self.per_epoch)
        return self.task.batches("train", self.config["batch_size"], seed=self.config["seed"],
                                 epoch=epoch, start=start, device=self.model.device,
                                 reuse=_reuse(self.model, self.staging))

    def step(self, x, y):
        """One iteration: the loss and its gradient by full BPTT, the running totals (and the
        clipping factor they give), the optimizer's update."""
        self.losses, grads, logits, y_step = self.model.step_arrays(x, y)
        self.recorder.record(self.losses, logits, y_step, grads)
        self.optimizer.lr = lr_at(self.config, self.it)     # the schedule's, at this step
        self.optimizer.step(self.model.params, grads, self.recorder.scale)
        self.it += 1
        self.prog.update(iteration=self.it, epoch=self.it // self.per_epoch,
                         batch=self.it % self.per_epoch)

    def report(self, stop, callback=None):
        """After a step: the interval's line of metrics.jsonl and the bar, an evaluation and a
        checkpoint when they are due."""
        it, config = self.it, self.config
        interval_end = it % config["log_every"] == 0 or it == self.total
        if (self.model.device == "cpu" or interval_end or self.eval_due(it)
                or callback is not None):
            acc = self.sync()
            self.run_loss = acc["loss_sum"] / max(acc["count"], 1)
            self.run_acc = acc["correct"] / max(acc["count"], 1)
        if interval_end:
            t = self.elapsed()
            self.log.write(iteration=it, split="train", loss=self.run_loss,
                           accuracy=self.run_acc, grad_norm=acc["grad_norm_sum"] / acc["steps"],
                           lr=lr_at(config, it - 1), epoch=it / self.per_epoch, time=round(t, 3),
                           it_per_s=round(it / max(t, 1e-9), 4))
        self.bar.update(it, self.run_loss, self.run_acc, interval_end)
        if interval_end:
            self.prog["interval"] = _new_interval()
            self.recorder.reset()
        if callback is not None:
            callback(it, float(np.mean(to_host(self.losses))))
        if self.eval_due(it):
            self.evaluate(self.eval_split, stop)
        self.prog["elapsed"] = self.elapsed()
        if it % config["checkpoint_every"] == 0 or it == self.total:
            self.checkpoint()

    def finish(self, stop):
        """(final test metrics or None, the stopping signal or None): the final evaluation on
        the test split once all iterations are done, and a checkpoint where a signal stopped
        the run. A signal after the final evaluation stops nothing: the run is complete."""
        final = None
        if self.it >= self.total:
            if self.prog["evaluated"].get("test") != self.it and stop.stopping() is None:
                if self.evaluate("test", stop):
                    self.prog["elapsed"] = self.elapsed()
                    self.checkpoint()
            if self.prog["evaluated"].get("test") == self.it:
                final = _last_record(self.out / METRICS, "test", self.it)
        self.prog["elapsed"] = self.elapsed()
        stopped = stop.stopping() if final is None else None
        if stopped is not None:
            self.checkpoint()
        return final, stopped

    def close(self):
        self.log.close()
        self.bar.close()
        self._close_task()

    def _close_task(self):
        if self.owns_task:
            self.task.close()

    # -- helpers --------------------------------------------------------------------------------
    def elapsed(self):
        return self._elapsed0 + time.perf_counter() - self._t_start

    def eval_due(self, it):
        return it > 0 and (it % self.config["eval_every"] == 0 or it == self.total)

    def sync(self):
        """prog["interval"] brought up to date; TrainingDiverged if a step was not finite."""
        acc = self.recorder.read()
        if acc["first_bad"] is not None:
            raise _diverged(acc, self.it, self.saved_at, self.ckpt_path, self.config, self.out)
        self.prog["interval"] = {k: acc[k] for k in StepRecorder.FIELDS}
        return acc

    def checkpoint(self):
        self.sync()                           # never save the parameters past a bad step
        self.prog["metrics_bytes"] = self.log.length()
        save_checkpoint(self.ckpt_path, self.model.params, self.optimizer.state_dict(),
                        self.config, self.prog)
        self.saved_at = self.it

    def evaluate(self, split, stop):
        """Evaluate at the current iteration and log it; False if a stop signal cut it short."""
        it = self.it
        res = evaluate(self.model, self.task, split, self.config["eval_batch_size"],
                       should_stop=lambda: stop.stopping() is not None,
                       progress=lambda done, total: self.bar.status(
                           f"iteration {it}: evaluating {split}, {done:,} / {total:,}"),
                       staging=self.staging)
        if res is None:
            return False
        self.prog["evaluated"][split] = it
        self.log.write(iteration=it, split=split, loss=res["loss"], accuracy=res["accuracy"],
                       count=res["count"], time=round(self.elapsed(), 3))
        self.bar.message(f"iteration {it}: {split} loss {res['loss']:.4f}  accuracy "
                         f"{res['accuracy']:.4f}")
        best = self.prog.get("best")
        if (self.config["keep_best"] and split == "valid"
                and (best is None or res["accuracy"] > best["accuracy"])):
            self.prog["best"] = dict(iteration=it, accuracy=res["accuracy"])
            save_checkpoint(self.out / BEST, self.model.params, self.optimizer.state_dict(),
                            self.config, dict(self.prog, elapsed=self.elapsed()))
        if self.on_evaluation is not None:
            self.on_evaluation(it, split, res)
        return True


def _warm_up(config, model, task):
    """Seconds spent compiling the kernels that a training step and an evaluation run (numba
    compiles each at its first call, or loads it from its disk cache), by one step of a
    throwaway copy of the model on a batch of one short sequence, so that neither the training
    time nor the first interval's it/s pays for it. On cuda the copy runs the kernels `model`
    chose for the run's batches."""
    t0 = time.perf_counter()
    warm = build_model(config, model.input_size, model.num_classes)
    if model.device == "cuda":
        warm.tuner = autotune.Fixed(model.kernels_for(config["batch_size"], task.T))
    x = np.zeros((1, min(task.T, 2), model.input_size), dtype=np.float32)
    y = np.zeros(1, dtype=np.int64)
    losses, grads, logits, y_step = warm.step_arrays(x, y)
    recorder = StepRecorder(warm.device, config["clip"], _new_interval())
    recorder.record(losses, logits, y_step, grads)
    build_optimizer(config, warm.params).step(warm.params, grads, recorder.scale)
    recorder.read()
    warm.forward(x)
    return time.perf_counter() - t0


def _say_what_changed(prog, arithmetic, echo):
    """On resume: where the run continues from, and what may keep its bits from matching an
    uninterrupted run's (another NumPy draws the data order; other numba, scipy or CPU)."""
    echo(f"  {'from iteration':<17} {prog['iteration']} (epoch {prog['epoch']}, "
         f"batch {prog['batch']})")
    if prog.get("numpy", np.__version__) != np.__version__:
        echo(f"note: this run drew its data order so far with NumPy {prog['numpy']}, and "
             f"continues with NumPy {np.__version__}. NumPy does not promise the same random "
             f"streams across versions, so the order from here on may differ from an "
             f"uninterrupted run's")
    before = prog.get("arithmetic", arithmetic)   # (runs saved before it was recorded)
    moved = [f"{k} {before.get(k)} -> {v}" for k, v in arithmetic.items()
             if before.get(k) != v]
    if moved:
        echo(f"note: this run's last steps ran elsewhere ({'; '.join(moved)}). The kernels' "
             f"floating-point results may differ in their last bits there, so the parameters "
             f"from here on need not be bit-identical to an uninterrupted run's")


def _last_record(metrics_path, split, iteration):
    """The last metrics.jsonl record of `split` at `iteration`, or None."""
    found = None
    with open(metrics_path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("split") == split and rec.get("iteration") == iteration:
                found = rec
    return found


# ----------------------------------------------------------------------------------------------
# Evaluating a saved run
# ----------------------------------------------------------------------------------------------

def evaluate_checkpoint(path, split="test", task_name=None, data_dir=None, T=None,
                        batch_size=None, task=None, device="auto", progress=None):
    """Evaluate the checkpoint of a run folder (or a checkpoint file) on a split of its task, or
    on another task with the same input size and number of classes (`task_name`), on `device`
    (cpu, cuda or auto; a run trained on either device evaluates on either).

    A run folder's config.json and its checkpoint must describe the same model; a task that does
    not fit the model raises TrainError. `progress` is passed to `evaluate`. Returns dict(loss,
    accuracy, count, iteration, model, task, T (the task's sequence length), split, device (the
    one used: cpu or cuda), checkpoint)."""
    saved = load_checkpoint(path)
    config = dict(saved["config"])
    where = saved["path"]
    for key in ("model", "task", "input_size", "num_classes"):
        if key not in config:
            raise CheckpointError(f"{where} has no {key!r} in its configuration")
    config_json = Path(path) / CONFIG
    if config_json.is_file():
        listed = read_config_json(config_json).get("model")
        if listed != config["model"]:
            raise CheckpointError(f"{where} is a checkpoint of model {config['model']!r}, but "
                                  f"{config_json} describes model {listed!r}: the folder mixes "
                                  f"two runs")
    trained_on = config["task"]
    if task_name is not None and task_name != trained_on:
        config["task"], config["T"] = task_name, None     # another task: its own length
    if T is not None:
        config["T"] = T
    if data_dir is not None:
        config["data_dir"] = data_dir
    config["device"] = resolve_device(device)
    model = build_model(config, config["input_size"], config["num_classes"])
    load_params_into(model, saved["params"], f"checkpoint {where}")
    owns_task = task is None
    if owns_task and config["task"] != trained_on:
        check_named_task_fits(model, config, f"{where}, trained on {trained_on!r},")
    task = load_task(config, task)
    try:
        check_task_fits(model, task, f"{where}, trained on {trained_on!r},")
        res = evaluate(model, task, split, batch_size or config.get("eval_batch_size", 256),
                       progress=progress)
    finally:
        if owns_task:
            task.close()
    return dict(res, iteration=saved["progress"]["iteration"], model=model.name, task=task.name,
                T=task.T, split=split, device=model.device, checkpoint=str(where))
