"""Hyperparameter sweeps: an Optuna study whose trials are ordinary runs, trained by Dask workers.

    python cli.py sweep run --out sweeps/NAME --model antisym-gated --task mnist \\
        --space appendix-c --iterations 5000 --prune
    python cli.py sweep report sweeps/NAME

A sweep folder holds

    sweep.json       what the study is: the options held fixed (model, task, iterations, ...),
                     the space searched, sampler, pruning, the Optuna storage and study name
    study.journal    the study (Optuna's journal file), unless --storage names another storage
    trials/NNNN/     trial NNNN's run folder (config.json, metrics.jsonl, checkpoint.h5, best.h5,
                     train.log): `eval`, `plot` and `train --resume` work on it

Every trial is chosen on the validation split (valid_size > 0 is required): its value is its
best validation accuracy, best.h5 keeps that checkpoint, and the test accuracy of best.h5 is
measured once the trial is complete, for the report alone.

Where trials run (WHERE: the device, the data folder) is not part of what a study is: `sweep run`
on a study begun on the CPU may go on with `--device cuda` (another machine, its data elsewhere:
`--data-dir`), and its unfinished trials resume there from their checkpoints. Each `sweep run`
runs its trials, new or resumed, where it says, or where the study began where it says nothing.

Who does what. The driver (`run`, one per `sweep run` process) claims trials and hands them to
Dask workers; `run_trial` trains one on a worker and records its result in the study. Grid
points are all enqueued when the study is created, in an order shuffled by the sampler seed (a
sweep stopped early has covered the space evenly), and claimed one at a time by an atomic step
of the storage (WAITING -> RUNNING), so drivers on several machines sharing the storage never
run a point twice. Random and TPE trials are drawn (`draw`) up to --trials in all, after any
points given with --enqueue (enqueued and claimed as a grid's are).

Pruning (successive halving, `RungPruner`) judges a trial at each rung against the trials that
have reached it. A trial that reaches a rung before two others while more may come pauses there
(a checkpoint, and its worker takes the next trial); its driver resumes it once it can be judged.
Without this, the first trial to reach a rung would always go on, and on one worker, where
trials run one after another, a sweep's first trial would run to the end, however bad.

Nothing lost. A trial writes checkpoints as any run does. A worker killed mid-trial: Dask runs
the trial again on another worker, which resumes it from its checkpoint (its result is recorded
once: the trial keeps its number). A driver stopped by Ctrl-C asks its trials to checkpoint and
stop, and releases them; one killed outright leaves them RUNNING with its host and process id,
and one that stopped answering (another machine) has not renewed their heartbeat for
STALE_SECONDS: the next `sweep run` on the study takes such trials over and resumes them. Two
processes never train one trial folder at once: a run folder's lock (nprnn.train.RunLock)
refuses the second, whose driver tries that trial again later.
"""
import itertools
import json
import logging
import math
import os
import re
import signal
import socket
import threading
import time
import uuid
import warnings
from concurrent.futures import CancelledError
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
import optuna
from numba import cuda
from distributed import (Client, Event, Nanny, Scheduler, SpecCluster, TimeoutError,
                         WorkerPlugin)
from distributed.comm.addressing import parse_address, parse_host_port
from distributed.comm.registry import get_backend
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from . import plotting
from .checkpoint import FILENAME, load_checkpoint
from .device import DeviceUnavailable, resolve_device, usable_cpus
from .files import pid_alive, temporary_name, written_atomically
from .sources import DataError
from .train import (BEST, CONFIG, DEFAULTS, METRICS, OPTIONS, SWEEP_VALID_SIZE, RunInUse,
                    RunLock, TrainError, TrainingDiverged, build_model, check_options_used,
                    evaluate_checkpoint, load_task, resolve_config, train, train_command)

# Appendix C of Chang et al. (2019): the grid searched for the Euler cells
SPACES = {
    "appendix-c": dict(sigma_w=[0.0, 1.0, 2.0, 4.0, 8.0, 16.0], eps=[0.01, 0.1, 1.0],
                       gamma=[0.001, 0.01, 0.1, 1.0],
                       lr=[0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0], optimizer=["sgd", "adagrad"]),
}
# the options a space may search (the others are held fixed: they say what the run is, not how)
SEARCHABLE = ("lr", "optimizer", "momentum", "sigma_w", "eps", "gamma", "gate_bias", "w_form",
              "init", "clip", "batch_size", "hidden", "pixels", "seed")
SAMPLERS = ("grid", "random", "tpe")
SWEEP = "sweep.json"
JOURNAL = "study.journal"
TRIALS = "trials"
VALID_SIZE = SWEEP_VALID_SIZE       # held out of the training set when a sweep does not say
STALE_SECONDS = 600                # a trial whose driver has not renewed it this long is free
HEARTBEAT_SECONDS = 60
CONNECT_SECONDS = 10               # to reach a --scheduler
RETRY_SECONDS = 30                 # a trial whose folder another process holds: try again then
REDUCTION = 3                      # successive halving keeps the best third at each rung
FORMAT = 1
FINAL_ITERATIONS = 50_000          # the chosen point's full runs: the length of README's results
FINAL_SEEDS = (0, 1)
# options that say where trials run, not what they are: a study continued may change them
WHERE = ("device", "data_dir")


class SweepError(Exception):
    """A sweep that cannot start or continue as asked; the message names the bad value."""


# ----------------------------------------------------------------------------------------------
# The space
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One searched option: a list of values (a grid axis), or a range [low, high] sampled
    uniformly (log=True: uniformly in log)."""
    name: str
    values: tuple = None
    low: float = None
    high: float = None
    log: bool = False

    @property
    def is_range(self):
        return self.values is None

    def distribution(self):
        if self.is_range:
            return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)
        return optuna.distributions.CategoricalDistribution(self.values)

    def suggest(self, trial):
        """This option's value in an Optuna trial."""
        if self.is_range:
            return trial.suggest_float(self.name, self.low, self.high, log=self.log)
        return trial.suggest_categorical(self.name, list(self.values))

    def to_json(self):
        if self.is_range:
            return dict(low=self.low, high=self.high, log=self.log)
        return dict(values=list(self.values))

    @classmethod
    def from_json(cls, name, d):
        if "values" in d:
            return cls(name, values=tuple(d["values"]))
        return cls(name, low=d["low"], high=d["high"], log=d["log"])


def _value(name, text, flag="--param"):
    """One value of option `name` from the command line (`flag`), as the option's kind reads
    it."""
    kind = OPTIONS[name].kind
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        what = "an integer" if kind == "int" else "a number"
        raise SweepError(f"{flag} {name}: {text!r} is not {what}") from None
    return text


def parse_param(text):
    """A --param value: NAME=v1,v2,... (a grid axis) or NAME=LOW:HIGH[:log] (a range of a
    float option)."""
    name, sep, rest = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep:
        raise SweepError(f"--param {text!r}: write NAME=v1,v2,... or NAME=LOW:HIGH[:log]")
    if name not in SEARCHABLE:
        raise SweepError(f"--param {text!r}: {name!r} cannot be searched; searchable: "
                         f"{', '.join(SEARCHABLE)}")
    rest = rest.strip()
    if ":" in rest:
        parts = rest.split(":")
        if OPTIONS[name].kind != "float" or len(parts) not in (2, 3) or (
                len(parts) == 3 and parts[2] != "log"):
            raise SweepError(f"--param {text!r}: a range is LOW:HIGH or LOW:HIGH:log, and only "
                             f"for the number options "
                             f"{', '.join(n for n in SEARCHABLE if OPTIONS[n].kind == 'float')}")
        low, high = _value(name, parts[0]), _value(name, parts[1])
        log = len(parts) == 3
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise SweepError(f"--param {text!r}: the range is empty (LOW must be below HIGH)")
        if log and low <= 0:
            raise SweepError(f"--param {text!r}: a log range needs LOW > 0")
        return Param(name, low=low, high=high, log=log)
    values = [v.strip() for v in rest.split(",") if v.strip()]
    if not values:
        raise SweepError(f"--param {text!r}: no values")
    values = tuple(dict.fromkeys(_value(name, v) for v in values))     # in order, once each
    return Param(name, values=values)


def parse_point(text, space):
    """An --enqueue value, NAME=VALUE,NAME=VALUE,... with a value for every searched option,
    each one of its axis's values or inside its range: {name: value}."""
    point = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not value.strip():
            raise SweepError(f"--enqueue {text!r}: write NAME=VALUE,NAME=VALUE,... for "
                             f"{', '.join(space)}")
        if name not in space:
            raise SweepError(f"--enqueue {text!r}: {name!r} is not searched by this sweep; it "
                             f"searches {', '.join(space)}")
        if name in point:
            raise SweepError(f"--enqueue {text!r}: {name} is given twice")
        v, axis = _value(name, value.strip(), "--enqueue"), space[name]
        if axis.is_range and not axis.low <= v <= axis.high:
            raise SweepError(f"--enqueue {text!r}: {name}={value.strip()} is outside the "
                             f"searched range [{axis.low}, {axis.high}]")
        if not axis.is_range and v not in axis.values:
            raise SweepError(f"--enqueue {text!r}: {name}={value.strip()} is not one of the "
                             f"searched values {', '.join(map(str, axis.values))}")
        point[name] = v if axis.is_range else axis.values[axis.values.index(v)]
    missing = [n for n in space if n not in point]
    if missing:
        raise SweepError(f"--enqueue {text!r}: give {', '.join(missing)} too (a point names "
                         f"every searched option)")
    return point


def parse_points(sampler, space, texts, trials=None):
    """The --enqueue values `texts` of a study of `sampler` over `space`, as points; refused for
    a grid, or beyond `trials`."""
    if texts and sampler == "grid":
        raise SweepError("--enqueue is for the random and tpe samplers: a grid study runs all "
                         "its points already")
    if trials is not None and len(texts) > trials:
        raise SweepError(f"--enqueue gives {len(texts)} points, more than --trials {trials}")
    return [parse_point(t, space) for t in texts]


def enqueue(study, spec, points, echo=print):
    """Put `points` first in the queue of a random or TPE study, each unless the study has it
    already (any trial with that point, finished or not); they count among its trials."""
    room = spec["trials"] - len(study.get_trials(deepcopy=False))
    if len(points) > room:
        raise SweepError(f"--enqueue gives {len(points)} points; the study has room for "
                         f"{max(room, 0)} more of its {spec['trials']} trials")
    for point in points:
        before = len(study.get_trials(deepcopy=False))
        study.enqueue_trial(point, skip_if_exists=True)
        shown = ", ".join(f"{k} {v}" for k, v in point.items())
        if len(study.get_trials(deepcopy=False)) > before:
            echo(f"trial {before} enqueued: {shown}")
        else:
            echo(f"not enqueued, the study has this point already: {shown}")


def make_space(space=None, params=()):
    """{name: Param}: a named space (SPACES), with --param values added or replacing its axes."""
    out = {}
    if space is not None:
        if space not in SPACES:
            raise SweepError(f"unknown space {space!r}; known: {', '.join(SPACES)}")
        out = {k: Param(k, values=tuple(v)) for k, v in SPACES[space].items()}
    names = [p.name for p in params]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise SweepError(f"--param {twice} is given more than once: give all its values in one, "
                         f"--param {twice}=v1,v2,...")
    for p in params:
        out[p.name] = p
    if not out:
        raise SweepError("nothing to search: give --space or at least one --param")
    return out


def grid_points(space, seed):
    """Every point of an all-list space, in the order the sweep runs them: shuffled by `seed`,
    so that a sweep stopped early has seen the whole space evenly."""
    names = sorted(space)
    points = [dict(zip(names, combo))
              for combo in itertools.product(*(space[n].values for n in names))]
    order = np.random.default_rng(seed).permutation(len(points))
    return [points[i] for i in order]


def task_shape(fixed, task=None):
    """(m, classes) of `task`, or of the task `fixed` names, which is loaded here (its cache
    built if need be, once for all trials): what its runs would say of it is a SweepError."""
    if task is not None:
        return task.m, task.num_classes
    try:
        with load_task(fixed) as named:
            return named.m, named.num_classes
    except (ValueError, OSError, DataError) as e:
        raise SweepError(f"task {fixed['task']}: {e}") from None


def check_space(fixed, space, task=None):
    """Refuse, before any trial, a space whose values a run would refuse: every value of every
    axis (the others at their first value; a range at both ends) goes through resolve_config,
    check_options_used and build_model, as a trial's run would; and a task that its runs could
    not load (`task`: an in-memory one, else the named one is loaded here)."""
    if "momentum" in space and any(
            v == "adagrad" for v in (space["optimizer"].values if "optimizer" in space
                                     else [fixed["optimizer"]])):
        raise SweepError("momentum is SGD's alone: a space that runs adagrad cannot search it")
    if fixed["valid_size"] <= 0:
        raise SweepError("a sweep chooses on the validation split: --valid-size must be > 0")
    if fixed["iterations"] < 1:
        raise SweepError("a sweep judges its trials on the validation split after training: "
                         "--iterations must be at least 1")
    m, classes = task_shape(fixed, task)
    first = {n: (p.low if p.is_range else p.values[0]) for n, p in space.items()}
    for name, p in space.items():
        for value in ((p.low, p.high) if p.is_range else p.values):
            point = dict(first, **{name: value})
            try:
                config = resolve_config(**dict(fixed, **point))
                check_options_used(config)
                build_model(dict(config, device="cpu"), m, classes)   # no GPU needed to check
            except (TrainError, ValueError, TypeError) as e:
                raise SweepError(f"{name} = {value!r} would be refused by every trial that "
                                 f"runs it: {e}") from None


# ----------------------------------------------------------------------------------------------
# The sweep folder and the study
# ----------------------------------------------------------------------------------------------

def definition(fixed, space, sampler, trials, prune, seed):
    """What a study is (what sweep.json records apart from where it is stored)."""
    return dict(fixed=fixed, space={n: p.to_json() for n, p in sorted(space.items())},
                sampler=sampler, trials=trials, prune=prune, sampler_seed=seed)


def space_of(spec):
    """The searched options of a sweep.json spec, name -> Param."""
    return {name: Param.from_json(name, d) for name, d in spec["space"].items()}


def read_sweep(folder):
    path = Path(folder) / SWEEP
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{folder} is not a sweep folder: it has no {SWEEP}") from None
    except (OSError, ValueError) as e:
        raise SweepError(f"{path} cannot be read: {e}") from None
    if spec.get("format") != FORMAT:
        raise SweepError(f"{path} has format {spec.get('format')!r}; this nprnn reads {FORMAT}")
    return spec


def _write_new(path, obj):
    """Write JSON to `path` only if no file is there (atomically; False if one was): written
    under a name of this process's own, then linked, which fails where `path` exists."""
    mine = temporary_name(path, "new")
    with written_atomically(mine) as tmp:
        Path(tmp).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    try:
        os.link(mine, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(mine)


def _shown(value):
    """A sweep.json value as the command line gives it: an axis as v1,v2 or LOW:HIGH[:log]."""
    if isinstance(value, dict) and "values" in value:
        return ",".join(map(str, value["values"]))
    if isinstance(value, dict) and "low" in value:
        return f"{value['low']}:{value['high']}" + (":log" if value["log"] else "")
    return "(none)" if value is None else repr(value)


def _differences(saved, given):
    """"name: X there, Y given" for each setting of two study definitions that differs (the
    fixed options but WHERE, and the space's axes, one by one)."""
    out = []
    for key in sorted(set(saved) | set(given)):
        a, b = saved.get(key), given.get(key)
        if key in ("fixed", "space"):
            a, b = a or {}, b or {}
            out += [f"{sub}: {_shown(a.get(sub))} there, {_shown(b.get(sub))} given"
                    for sub in sorted(set(a) | set(b)) if a.get(sub) != b.get(sub)
                    and not (key == "fixed" and sub in WHERE)]
        elif a != b:
            out.append(f"{key}: {_shown(a)} there, {_shown(b)} given")
    return out


def open_storage(folder, url):
    """The study's storage: the journal file in the sweep folder, or an Optuna storage URL."""
    try:
        if url is None:
            return JournalStorage(JournalFileBackend(str(Path(folder) / JOURNAL)))
        return optuna.storages.get_storage(url)
    except Exception as e:           # sqlalchemy, redis, OS errors: say which storage
        where = Path(folder) / JOURNAL if url is None else url
        raise SweepError(f"cannot open the study storage {where}: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


class RungPruner(optuna.pruners.BasePruner):
    """Asynchronous successive halving on the validation accuracy, rungs at `first`, 3 x, 9 x ...
    iterations: at a rung a trial goes on only if it is in the best third of the trials with a
    value there (every trial that has reached it: gone on, pruned, or paused there), and while
    fewer than three have one, only if it is the best of them. (Optuna's
    SuccessiveHalvingPruner counts only the trials it has judged at the rung, and a paused trial
    has not been judged.)"""

    def __init__(self, first):
        self.first = first

    def is_rung(self, step):
        rung = self.first
        while rung < step:
            rung *= REDUCTION
        return rung == step

    def prune(self, study, trial):
        step = trial.last_step
        if step is None or not self.is_rung(step):
            return False
        value = trial.intermediate_values[step]
        there = sorted((t.intermediate_values[step] for t in study.get_trials(deepcopy=False)
                        if step in t.intermediate_values), reverse=True)
        return value < there[max(1, len(there) // REDUCTION) - 1]


def make_pruner(spec):
    if not spec["prune"]:
        return optuna.pruners.NopPruner()
    return RungPruner(spec["fixed"]["eval_every"])


def waits_at_rung(study, spec, number, step):
    """Whether trial `number`, at rung `step`, waits for others before it is judged there: while
    fewer than three trials have a value at the rung, and another may still reach it (a trial
    not started, or running below the rung), a verdict would let it go on as the best of too few
    (the first trial to reach a rung would run to the end, however bad)."""
    trials = study.get_trials(deepcopy=False)
    if sum(step in t.intermediate_values for t in trials) >= REDUCTION:
        return False
    started = [t for t in trials if t.state != TrialState.WAITING]
    if spec["sampler"] != "grid" and len(started) < spec["trials"]:
        return True                                      # trials yet to be drawn
    return any(t.number != number and (t.state == TrialState.WAITING or (
        t.state == TrialState.RUNNING and (t.last_step or 0) < step)) for t in trials)


def make_sampler(spec, drawn=0):
    """The sampler of `sweep run`, seeded by the sampler seed and how many trials the study
    holds (`drawn`): a sweep continued draws on where it stopped, not the points it began with."""
    seed = int(np.random.SeedSequence([spec["sampler_seed"], drawn]).generate_state(1)[0])
    if spec["sampler"] == "tpe":
        with warnings.catch_warnings():      # Optuna 4 calls constant_liar experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    return optuna.samplers.RandomSampler(seed=seed)         # grid: trials are enqueued


REDRAWS = 10       # TPE draws, at most, for a point the study does not hold


def _as_the_sampler_sees(trial):
    """An unfinished trial that has been evaluated (paused at a rung, or training past an
    evaluation) as TPE should weigh it: pruned at its last evaluation, ranked as a pruned trial
    is (by the iteration reached, then the accuracy there)."""
    if trial.state != TrialState.RUNNING or not trial.intermediate_values:
        return trial
    return optuna.trial.create_trial(state=TrialState.PRUNED, params=trial.params,
                                     distributions=trial.distributions,
                                     intermediate_values=trial.intermediate_values)


def draw(study, spec, distributions):
    """A new trial of a random or TPE study, at a point the sampler draws.

    TPE draws from a copy of the study in which each unfinished trial that has been evaluated
    counts as pruned at its last evaluation. Left RUNNING, the leads that wait at a rung, the
    best trials of a pruned sweep, would count among the worst (Optuna's constant liar, on by
    default since Optuna 5) or not at all. A trial not yet evaluated stays RUNNING there, a
    liar that keeps parallel draws apart. TPE draws again (the point counted running once
    more), up to REDRAWS times, rather than take a point the study holds: one that finished
    would teach nothing new (its trial would take that result), one that has not would train
    from scratch beside it."""
    trials = study.get_trials(deepcopy=False)
    sampler = make_sampler(spec, len(trials))
    if spec["sampler"] == "tpe":
        view = optuna.create_study(directions=study.directions, sampler=sampler)
        view.add_trials([_as_the_sampler_sees(t) for t in trials
                         if t.state != TrialState.WAITING])
        held = [t.params for t in trials]
        for _ in range(REDRAWS):             # each point drawn stays in the view, running
            params = view.ask(distributions).params
            if params not in held:
                break
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.PartialFixedSampler(params, sampler)
    kept, study.sampler = study.sampler, sampler
    try:
        return study.ask(distributions)
    finally:
        study.sampler = kept


def load_study(spec, storage):
    study = optuna.load_study(study_name=spec["study"], storage=storage,
                              pruner=make_pruner(spec))
    study.sampler = make_sampler(spec, len(study.get_trials(deepcopy=False)))
    return study


def open_sweep(folder, fixed=None, space=None, sampler=None, trials=None, prune=False, seed=0,
               storage=None, task=None):
    """(spec, storage, study) of the sweep in `folder`: created from the given definition if the
    folder has none, else the recorded one, which a given definition must match (or
    SweepError names what differs)."""
    folder = Path(folder)
    path = folder / SWEEP
    optuna.logging.set_verbosity(optuna.logging.WARNING)    # our lines say what happens
    if fixed is not None:
        if sampler not in SAMPLERS:
            raise SweepError(f"unknown sampler {sampler!r}; one of {', '.join(SAMPLERS)}")
        is_grid = all(not p.is_range for p in space.values())
        if sampler == "grid" and not is_grid:
            ranged = [n for n, p in space.items() if p.is_range]
            raise SweepError(f"the grid sampler needs lists of values; {', '.join(ranged)} "
                             f"is a range: use --sampler random or tpe")
        if sampler == "grid":
            size = math.prod(len(p.values) for p in space.values())
            trials = size if trials is None else min(trials, size)
        elif trials is None:
            raise SweepError(f"--sampler {sampler} needs --trials (how many points to try)")
        if trials < 1:
            raise SweepError(f"--trials must be at least 1, got {trials}")
        given = definition(fixed, space, sampler, trials, prune, seed)
    if path.exists():
        spec = read_sweep(folder)
        if fixed is not None:
            diff = _differences({k: spec[k] for k in given}, given)
            if storage is not None and storage != spec["storage"]:
                diff.append(f"storage: {spec['storage']!r} there, {storage!r} given")
            if diff:
                raise SweepError(f"{folder} holds another study ({'; '.join(diff)}): continue "
                                 f"it with `sweep run --out {folder}` alone, or choose another "
                                 f"--out")
        if spec["storage"] is None and not (folder / JOURNAL).is_file():
            raise SweepError(f"{folder} has {SWEEP} but no {JOURNAL}, the record of its "
                             f"trials: put it back, or start the sweep in another --out")
        store = open_storage(folder, spec["storage"])
        try:
            return spec, store, load_study(spec, store)
        except KeyError:
            raise SweepError(f"the storage of {folder} holds no study {spec['study']!r}: "
                             f"{spec['storage'] or folder / JOURNAL} is not this sweep's") from None
    if fixed is None:
        raise SweepError(f"{folder} is not a sweep folder: it has no {SWEEP}. Start one with "
                         f"--model, --task and --space or --param")
    if folder.exists() and not folder.is_dir():
        raise SweepError(f"{folder} is a file, not a folder")
    check_space(fixed, space, task)          # a study continued was checked when it was made
    folder.mkdir(parents=True, exist_ok=True)
    spec = dict(given, format=FORMAT, storage=storage,
                study=f"{folder.resolve().name}-{uuid.uuid4().hex[:8]}")
    store = open_storage(folder, storage)
    study = optuna.create_study(study_name=spec["study"], storage=store, direction="maximize",
                                sampler=make_sampler(spec), pruner=make_pruner(spec))
    if spec["sampler"] == "grid":
        for point in grid_points(space, seed)[:spec["trials"]]:
            study.enqueue_trial(point)
    if not _write_new(path, spec):     # another driver made it first: use that one
        return open_sweep(folder, fixed, space, sampler, trials, prune, seed, storage, task)
    return spec, store, study


# ----------------------------------------------------------------------------------------------
# A trial, on a worker
# ----------------------------------------------------------------------------------------------

def trial_folder(folder, number):
    return Path(folder) / TRIALS / f"{number:04d}"


def _records(metrics):
    """The records of a metrics.jsonl that parse, in order (a line cut by a kill is skipped:
    train cuts it on resume); none if there is no file yet."""
    try:
        with open(metrics) as f:
            lines = f.readlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _valid_records(metrics):
    """(iteration, accuracy) of every validation line of a metrics.jsonl, in order."""
    return [(r["iteration"], r["accuracy"]) for r in _records(metrics)
            if r.get("split") == "valid"]


def _clear_unstarted(out):
    """What a trial killed before its first checkpoint (while its kernels compiled, say) left:
    config.json and metrics.jsonl without checkpoint.h5, which `train` would refuse as another
    run's. Removed under the folder's lock (RunInUse if a process trains there)."""
    if not out.is_dir():
        return
    with RunLock(out):
        if not (out / FILENAME).exists():
            for name in (CONFIG, METRICS):
                (out / name).unlink(missing_ok=True)


def share_cores(threads):
    """Let this thread's numba kernels use `threads` threads (None: as the process started).
    numba counts them per calling thread; its pool has one thread per core (NUMBA_NUM_THREADS
    is left alone: a Dask nanny sets its workers' environment after their Python has imported
    numba, and numba refuses to compile once the two disagree and its threads have started)."""
    if threads is not None:
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))


def run_trial(folder, number, driver, task=None, threads=None, where=None):
    """Train trial `number` of the sweep in `folder` (a fresh run, or its checkpoint resumed),
    report each validation accuracy to the study, and record the result there. Called on a
    Dask worker; `threads`: numba threads for it (a local cluster's share of the cores; numba
    counts them per calling thread, and this is the worker's task thread); `where`: WHERE
    options that replace the study's. Returns
    dict(number, params, state, value, iteration, test_accuracy, message)."""
    share_cores(threads)
    folder = Path(folder)
    spec = read_sweep(folder)
    store = open_storage(folder, spec["storage"])
    study = load_study(spec, store)
    study_id = store.get_study_id_from_name(spec["study"])
    trial_id = store.get_trial_id_from_study_id_trial_number(study_id, number)
    frozen = store.get_trial(trial_id)
    result = dict(number=number, params=frozen.params, state=frozen.state.name.lower(),
                  value=frozen.value,
                  iteration=None, test_accuracy=frozen.user_attrs.get("test_accuracy"),
                  message="")
    if frozen.state != TrialState.RUNNING:       # recorded already (a rerun after a kill)
        return result
    trial = optuna.Trial(study, trial_id)
    # the point: an enqueued one's values (a grid's, --enqueue's), or those study.ask drew
    # (suggesting again returns them)
    params = {name: p.suggest(trial) for name, p in space_of(spec).items()}
    result["params"] = params
    out = trial_folder(folder, number)
    resume = (out / FILENAME).is_file()
    # a point drawn again takes its twin's result, unless it has trained already (drawn while
    # its twin ran, and resumed now): then it goes on by itself
    twin = None if resume else _finished_twin(study, number, params)
    if twin is not None:
        return _take_result_of(twin, study, store, trial, trial_id, result)
    if not resume:
        try:
            _clear_unstarted(out)
        except RunInUse as e:
            return dict(result, state="busy", message=str(e))
    where = where or {}
    config = dict(spec["fixed"], **params, **where, keep_best=True)
    stop_event = Event(f"nprnn-stop-{driver}")
    pruned, paused, last_look = [], [], [0.0]

    def report(iteration, accuracy, judge=True):
        if iteration not in trial.storage.get_trial(trial_id).intermediate_values:
            trial.report(accuracy, iteration)
        if not judge or pruned or paused:
            return
        if (spec["prune"] and study.pruner.is_rung(iteration)
                and waits_at_rung(study, spec, number, iteration)):
            paused.append(iteration)
        elif trial.should_prune():
            pruned.append(iteration)

    def on_evaluation(iteration, split, metrics):
        if split == "valid":
            report(iteration, metrics["accuracy"])

    def should_stop():
        if pruned:
            return "the sweep's pruner"
        if paused:
            return "the sweep (waiting for other trials at this rung)"
        now = time.monotonic()
        if now - last_look[0] >= 0.5:            # a round trip to the scheduler
            last_look[0] = now
            if stop_event.is_set():
                return "the sweep's stop"
        return None

    if resume:         # what the checkpoint holds was reported before, unless a kill lost it;
        # an evaluation at the checkpoint (where a trial waits at its rung) is judged again
        saved_at = load_checkpoint(out / FILENAME)["progress"]["iteration"]
        for iteration, accuracy in _valid_records(out / METRICS):
            if iteration <= saved_at:
                report(iteration, accuracy, judge=iteration == saved_at)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "a") as log:
        def echo(message):
            log.write(f"{message}\n")
            log.flush()
        try:
            summary = train(None if resume else config, out, resume=resume, given=where,
                            task=task, echo=echo, progress=False, should_stop=should_stop,
                            on_evaluation=on_evaluation)
        except TrainingDiverged as e:
            store.set_trial_user_attr(trial_id, "error", str(e))    # while it can take one
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
            return dict(result, state="fail", message=str(e))
        except RunInUse as e:
            return dict(result, state="busy", message=str(e))
    valid = _valid_records(out / METRICS)
    best = max((a for _, a in valid), default=None)
    result.update(iteration=summary["iteration"], value=best)
    store.set_trial_user_attr(trial_id, "iteration", summary["iteration"])
    if pruned:
        study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
        return dict(result, state="pruned")
    if paused:
        return dict(result, state="paused", message="judged at this rung once three trials "
                    "have reached it, or no other trial can")
    if not summary["completed"]:                 # stopped by the driver: resumed later
        return dict(result, state="stopped")
    test = _test_of_best(out, valid, summary, task, config["device"])
    result["test_accuracy"] = test
    store.set_trial_user_attr(trial_id, "test_accuracy", test)
    study.tell(number, best, skip_if_finished=True)
    return dict(result, state="complete")


def _finished_twin(study, number, params):
    """A finished trial (complete, pruned or failed) at the same point as trial `number`, or None.
    A sampler may draw a point again (random sampling over a grid's values; TPE once all its
    draws are points the study holds, as in a grid smaller than --trials); all else is held
    fixed and training is deterministic, so running it again would repeat that trial exactly."""
    return next((t for t in study.get_trials(deepcopy=False, states=(
        TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
        if t.number != number and t.params == params), None)


def _take_result_of(twin, study, store, trial, trial_id, result):
    """Record `trial` as its twin was recorded, without training: its validation accuracies,
    iteration, test accuracy or error, and state. Returns run_trial's dict."""
    for step, value in sorted(twin.intermediate_values.items()):
        trial.report(value, step)
    for key in ("iteration", "test_accuracy", "error"):
        if key in twin.user_attrs:
            store.set_trial_user_attr(trial_id, key, twin.user_attrs[key])
    store.set_trial_user_attr(trial_id, "twin_of", twin.number)
    complete = twin.state == TrialState.COMPLETE
    study.tell(trial.number, twin.value if complete else None, state=twin.state,
               skip_if_finished=True)
    best = twin.value if complete else max(twin.intermediate_values.values(), default=None)
    return dict(result, state=twin.state.name.lower(), value=best,
                iteration=twin.user_attrs.get("iteration"),
                test_accuracy=twin.user_attrs.get("test_accuracy"),
                message=f"the point of trial {twin.number} again: its result, not trained again")


def _test_of_best(out, valid, summary, task, device):
    """The test accuracy of best.h5: train's final test evaluation where the best validation
    accuracy was the last one (the same parameters), else an evaluation of best.h5."""
    best_it = max(valid, key=lambda r: r[1])[0]
    if summary["final"] is not None and best_it == summary["iteration"]:
        return summary["final"]["accuracy"]
    return evaluate_checkpoint(out / BEST, "test", task=task, device=device)["accuracy"]


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------

def local_cluster(device, workers=None):
    """(a Dask cluster on this machine, numba threads per trial): one worker per GPU for cuda
    (each seeing its own; threads None), or `workers` on the CPU (default: one per two cores)
    sharing the cores, each trial with its share (`share_cores`; the environment says it to
    the BLAS and OpenMP libraries a trial loads)."""
    cores = usable_cpus()
    threads = None
    if device == "cuda":
        gpus = len(cuda.gpus)
        workers = workers or gpus
        envs = [dict(CUDA_VISIBLE_DEVICES=str(i % gpus)) for i in range(workers)]
    else:
        workers = workers or max(1, cores // 2)
        threads = max(1, cores // workers)
        envs = [dict(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                     MKL_NUM_THREADS=str(threads))] * workers
    specs = {f"trainer-{i}": dict(cls=Nanny, options=dict(
        nthreads=1, env=env, memory_limit=0, dashboard=False, silence_logs=logging.ERROR))
             for i, env in enumerate(envs)}
    scheduler = dict(cls=Scheduler, options=dict(dashboard=False, dashboard_address=":0"))
    return SpecCluster(workers=specs, scheduler=scheduler, silence_logs=logging.ERROR), threads


class LeaveInterruptsToTheDriver(WorkerPlugin):
    """Ctrl-C in a terminal reaches a local cluster's workers too (they share the driver's
    process group): they ignore it, and the driver asks their trials to checkpoint and stop.
    (A plugin, so that a worker the nanny restarts after a kill gets it too.)"""

    def setup(self, worker):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _free(trial, now):
    """Whether a RUNNING trial has no live driver: released (driver ""), its driver's process
    gone (this host), or not renewed for STALE_SECONDS. (A trial just claimed has no driver yet:
    its claimer writes it next.)"""
    owner = trial.user_attrs.get("driver")
    if owner == "":
        return True
    if owner is not None:
        host, _, rest = owner.partition(":")
        pid = rest.partition(":")[0]
        if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
            return True
    since = trial.user_attrs.get("heartbeat", trial.datetime_start.timestamp()
                                 if trial.datetime_start else now)
    return now - since > STALE_SECONDS


class Driver:
    """Claims the study's trials and keeps the workers busy with them (see the module)."""

    def __init__(self, folder, spec, store, study, client, task, threads, where):
        self.folder, self.spec, self.store, self.study = folder, spec, store, study
        self.client, self.task, self.threads, self.where = client, task, threads, where
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.study_id = store.get_study_id_from_name(spec["study"])
        self.stop_event = Event(f"nprnn-stop-{self.id}", client=client)
        self.running = {}                  # future -> trial number
        self.later = []                    # (time, number): busy elsewhere, tried again then
        self.paused = []                   # (number, rung): waiting for other trials there
        self.adopted = []                  # taken over, not yet submitted
        self.beat = self.looked = 0.0
        self.distributions = {n: p.distribution() for n, p in space_of(spec).items()}

    def held(self):
        """The numbers of the trials this driver holds, in flight or not."""
        return (list(self.running.values()) + [n for _, n in self.later] + self.adopted
                + [n for n, _ in self.paused])

    def _set(self, number, key, value):
        """A user attribute of a trial, unless it has finished meanwhile (its worker told)."""
        tid = self.store.get_trial_id_from_study_id_trial_number(self.study_id, number)
        try:
            self.store.set_trial_user_attr(tid, key, value)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass

    def _own(self, number):
        self._set(number, "driver", self.id)
        self._set(number, "heartbeat", time.time())

    def _claim(self):
        """The number of the next trial this driver runs, or None when there is none."""
        now = time.time()
        for i, (when, number) in enumerate(self.later):
            if when <= now:
                del self.later[i]
                return number
        for i, (number, rung) in enumerate(self.paused):
            if not waits_at_rung(self.study, self.spec, number, rung):
                del self.paused[i]
                self._set(number, "paused_at", None)
                return number
        if self.adopted:
            return self.adopted.pop(0)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            tid = self.store.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
            try:
                claimed = self.store.set_trial_state_values(tid, TrialState.RUNNING)
            except optuna.exceptions.UpdateFinishedTrialError:
                claimed = False                  # another driver claimed and finished it
            if claimed:
                self._own(t.number)
                return t.number
        if self.spec["sampler"] != "grid":
            if len(self.study.get_trials(deepcopy=False)) < self.spec["trials"]:
                number = draw(self.study, self.spec, self.distributions).number
                self._own(number)
                return number
        return None

    def take_over(self):
        """Claim the RUNNING trials that no live driver holds; returns their numbers."""
        now, taken = time.time(), []
        held = set(self.held())
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number not in held and _free(t, now):
                self._own(t.number)
                self._set(t.number, "paused_at", None)    # resumed: judged again at its rung
                taken.append(t.number)
        self.adopted += taken
        return taken

    def submit(self, number):
        # a key of its own per submission: Dask hands back the old future for a key it still
        # holds, whose result would be read again
        key = f"trial-{self.spec['study']}-{number}-{uuid.uuid4().hex[:8]}"
        future = self.client.submit(run_trial, str(self.folder), number, self.id, self.task,
                                    self.threads, self.where, key=key, pure=False)
        self.running[future] = number

    def tend(self):
        """Every HEARTBEAT_SECONDS: renew the held trials' heartbeat, and take over trials that
        have lost their driver since."""
        if time.time() - self.beat < HEARTBEAT_SECONDS:
            return []
        self.beat = time.time()
        for number in self.held():
            self._set(number, "heartbeat", self.beat)
        return self.take_over()

    def release(self, numbers):
        """Leave these trials, where unfinished, to the next `sweep run` (driver "")."""
        for number in numbers:
            self._set(number, "driver", "")

    def loop(self, slots, stop, on_result, echo, on_tick=None):
        """Run trials until this driver finds none to run (or `stop()` is true); on_result(result)
        for each that ends, and on_tick() about once a second while they run."""
        while not stop():
            if on_tick is not None:
                on_tick()
            taken = self.tend()
            if taken:
                echo(f"taking over trials {', '.join(map(str, taken))}, left unfinished: they "
                     f"resume from their checkpoints")
            while len(self.running) < slots:
                number = self._claim()
                if number is None:
                    break
                self.submit(number)
            if not self.running and not self.later and not self.paused:
                return True
            if not self.running:
                time.sleep(1.0)
                continue
            for future in self._wait(1.0, any):
                on_result(self._result(future, self.running.pop(future)))
        return False

    def _wait(self, seconds, until):
        """The futures in flight that are done, once `until` (any, all) of them are, or after
        `seconds`. (Polled: distributed.wait would take the process's default client, which
        another driver in this process may have closed.)"""
        end = time.monotonic() + seconds
        while True:
            done = [f for f in self.running if f.done()]
            if (not self.running or until(f.done() for f in self.running)
                    or time.monotonic() >= end):
                return done
            time.sleep(0.05)

    def _result(self, future, number):
        """A finished future's result; a trial that could not run now is tried again later."""
        try:
            result = future.result()
        except CancelledError:       # its task was cancelled (a restarted scheduler): again
            self.later.append((time.time() + RETRY_SECONDS, number))
            return dict(number=number, state="cancelled", message="tried again later")
        except Exception as e:       # the trial raised, or its workers kept dying (KilledWorker)
            message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._set(number, "error", message)
            self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
            return dict(number=number, state="fail", message=message)
        if result["state"] in ("busy", "stopped"):   # held elsewhere; or stopped by another
            self.later.append((time.time() + RETRY_SECONDS, number))   # driver's stop
        elif result["state"] == "paused":
            self.paused.append((number, result["iteration"]))
            self._set(number, "paused_at", result["iteration"])
        return result

    def stop(self, wait_seconds):
        """Ask the trials in flight to checkpoint and stop, wait for them up to wait_seconds,
        and release every trial this driver holds."""
        self.stop_event.set()
        self._wait(wait_seconds, all)
        self.release(self.held())


def status(study, total, running):
    """Where a sweep stands: dict(done, total, running (trials in flight here), pruned, failed,
    best (the best validation accuracy any trial has reported so far, or None))."""
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    seen = [v for t in trials for v in ([t.value] if t.value is not None else
                                        list(t.intermediate_values.values()))]
    return dict(done=sum(s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                         for s in states),
                total=total, running=running, pruned=states.count(TrialState.PRUNED),
                failed=states.count(TrialState.FAIL), best=max(seen, default=None))


def _point(params):
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in sorted(params.items()))


def describe(result):
    """A trial's line as the driver prints it."""
    value = result.get("value")
    point = f" ({_point(result['params'])})" if result.get("params") else ""
    parts = [f"trial {result['number']}{point}: {result['state']}"]
    if result.get("iteration") is not None:
        parts.append(f"iteration {result['iteration']}")
    if value is not None:
        parts.append(f"best valid {value:.4f}")
    if result.get("message"):
        parts.append(result["message"])
    return ", ".join(parts)


def _check_address(address):
    """Raise ValueError unless `address` is one Dask can dial (SCHEME://HOST:PORT, HOST:PORT, or
    inproc://...). Said before Client is made: given an address without a port, it sometimes
    waits for ever instead of raising (distributed 2026.8)."""
    scheme, location = parse_address(address)
    get_backend(scheme)
    if scheme != "inproc":
        try:
            parse_host_port(location)
        except ValueError:
            raise ValueError(f"{address!r} is not an address of the form tcp://HOST:PORT") from None


def _device(fixed):
    try:
        return resolve_device(fixed["device"])
    except DeviceUnavailable as e:
        raise SweepError(str(e)) from None


def run(folder, fixed=None, space=None, sampler=None, trials=None, prune=False, seed=0,
        storage=None, workers=None, scheduler=None, task=None, echo=print, stop=None,
        progress=None, where=None, enqueue_points=()):
    """Run the sweep in `folder` (created from the definition given, or continued), until every
    trial is recorded or `stop()` says to stop. `task`: an in-memory task shipped to the
    workers instead of the named one (tests). `progress(status)` (`status`'s dict) after each
    trial and every few seconds while trials run.
    `where`: {WHERE option: value} for the trials from now on, in place of the study's (e.g.
    device "cuda" for a study begun on the CPU). `enqueue_points`: --enqueue values, their
    points run first. Returns dict(done, total, complete (bool), stopped (bool))."""
    folder = Path(folder)
    stop = stop or (lambda: False)
    where = dict(where or {})
    if set(where) - set(WHERE):
        raise SweepError(f"only {', '.join(WHERE)} may change where a study's trials run; got "
                         f"{', '.join(sorted(set(where) - set(WHERE)))}")
    if fixed is not None:                # no GPU for --device cuda, bad points: said before
        _device(dict(fixed, **where))    # the folder is made
        points = parse_points(sampler, space, enqueue_points, trials)
    spec, store, study = open_sweep(folder, fixed, space, sampler, trials, prune, seed, storage,
                                    task)
    if fixed is None:
        points = parse_points(spec["sampler"], space_of(spec), enqueue_points)
    here = dict(spec["fixed"], **where)
    device = _device(here)
    changed = {k: v for k, v in where.items() if v != spec["fixed"][k]}
    if changed:                          # the task must load from there too
        task_shape(here, task)
    enqueue(study, spec, points, echo)
    threads = None                       # another cluster's workers: as they were started
    if scheduler is not None:
        try:
            _check_address(scheduler)
            client = Client(scheduler, timeout=CONNECT_SECONDS, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise SweepError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
        cluster = None
    else:
        cluster, threads = local_cluster(device, workers)
        client = Client(cluster, set_as_default=False)
        client.register_plugin(LeaveInterruptsToTheDriver(), name="nprnn-interrupts")
    try:
        slots = sum(client.nthreads().values()) or 1
        echo(f"sweep {spec['study']} in {folder}: {spec['trials']} trials, {spec['sampler']} "
             f"sampler{', pruned by successive halving' if spec['prune'] else ''}; "
             f"{len(client.nthreads())} workers ({client.scheduler.address})")
        if changed:
            def said(k, v):            # data_dir None: $NPRNN_DATA_DIR, else ./data
                return f"{k} {'the default' if v is None else v}"
            echo("trials run with " + ", ".join(said(k, v) for k, v in changed.items())
                 + " (the study began with "
                 + ", ".join(said(k, spec["fixed"][k]) for k in changed) + ")")
        # every trial this driver runs, new or resumed, runs here: a trial that another
        # driver ran on its GPU resumes on this one's CPU unless this one says cuda too
        driver = Driver(folder, spec, store, study, client, task, threads,
                        {k: here[k] for k in WHERE})

        def counted():
            return len(study.get_trials(deepcopy=False, states=(
                TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))

        last = [0.0]

        def report_status(every=0.0):
            """progress(status), at most once in `every` seconds."""
            if progress is None or time.monotonic() - last[0] < every:
                return
            last[0] = time.monotonic()
            progress(status(study, spec["trials"], len(driver.running)))

        def on_result(result):
            echo(describe(result))
            report_status()

        try:
            finished = driver.loop(slots, stop, on_result, echo,
                                   on_tick=lambda: report_status(every=5.0))
        except KeyboardInterrupt:
            finished = False
        if not finished:
            echo("stopping: the trials in flight write a checkpoint and stop ...")
            driver.stop(wait_seconds=120)
        done = counted()
        return dict(done=done, total=spec["trials"], complete=done >= spec["trials"],
                    stopped=not finished)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------

def _reached(out):
    """The last iteration a trial's metrics.jsonl records, or None."""
    return next((r["iteration"] for r in reversed(_records(out / METRICS))
                 if "iteration" in r), None)


def trial_rows(folder):
    """(spec, rows, waiting): a row per trial that has started, best validation accuracy first,
    the chosen one (the best complete trial) marked; and how many trials wait. A row: number,
    params, state (complete, pruned, fail, running, paused at a rung, or stopped: left
    unfinished with no driver holding it), iteration, valid (best validation accuracy so far),
    test (of best.h5, for complete trials), chosen, error, twin_of (the trial whose result a
    point drawn again took, or None)."""
    spec, _, study = open_sweep(folder)
    rows, waiting, now = [], 0, time.time()
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            waiting += 1
            continue
        reported = list(t.intermediate_values.values())
        valid = t.value if t.state == TrialState.COMPLETE else max(reported, default=None)
        state = t.state.name.lower()
        if t.state == TrialState.RUNNING and _free(t, now):
            state = "stopped"             # no driver holds it: the next `sweep run` resumes it
        elif t.state == TrialState.RUNNING and t.user_attrs.get("paused_at") is not None:
            state = "paused"              # at a rung, until others reach it
        rows.append(dict(number=t.number, params=dict(t.params), state=state,
                         iteration=(_reached(trial_folder(folder, t.number))
                                    or t.user_attrs.get("iteration")), valid=valid,
                         test=t.user_attrs.get("test_accuracy"), chosen=False,
                         error=t.user_attrs.get("error"), twin_of=t.user_attrs.get("twin_of")))
    complete = [r for r in rows if r["state"] == "complete" and r["valid"] is not None]
    if complete:
        max(complete, key=lambda r: (r["valid"], -r["number"]))["chosen"] = True
    rows.sort(key=lambda r: (r["valid"] is None, -(r["valid"] or 0), r["number"]))
    return spec, rows, waiting


def final_commands(folder, spec, chosen):
    """(iterations, commands): the `train` commands that run the chosen point on the whole
    training set (no validation split: evaluated on the test split) to FINAL_ITERATIONS, or the
    sweep's length if longer, one run per seed of FINAL_SEEDS, in runs/<sweep folder>-s<seed>."""
    fixed = spec["fixed"]
    iterations = max(FINAL_ITERATIONS, fixed["iterations"])
    config = dict(fixed, **chosen["params"], valid_size=0, keep_best=False, iterations=iterations)
    for key in ("eval_every", "log_every", "checkpoint_every"):     # a short sweep's cadence
        config[key] = DEFAULTS[key]                                  # is not a long run's
    always = ("iterations", "seed", *chosen["params"])       # what makes it the chosen run
    return iterations, [train_command(dict(config, seed=seed), f"runs/{Path(folder).name}-s{seed}",
                                      always) for seed in FINAL_SEEDS]


def _trials(numbers):
    return f"trial{'s' if len(numbers) > 1 else ''} {', '.join(numbers)}"


def coverage(spec, rows):
    """What the search covered, a line per searched option with a list of values: for each value,
    the trials started with it (for a grid, of the points queued that have it: the whole grid,
    or the first --trials of its order), and their best validation accuracy, or "all failed"."""
    lines = []
    grid = spec["sampler"] == "grid"
    if grid:                      # the points queued: all of the grid, or --trials of its order
        queued = grid_points(space_of(spec), spec["sampler_seed"])[:spec["trials"]]
    for name, d in sorted(spec["space"].items()):
        if "values" not in d:
            continue
        parts = []
        for v in d["values"]:
            mine = [r for r in rows if r["params"].get(name) == v]
            best = max((r["valid"] for r in mine if r["valid"] is not None), default=None)
            where = f" of {sum(p[name] == v for p in queued)}" if grid else ""
            outcome = (f", best {best:.4f}" if best is not None else
                       ", all failed" if mine and all(r["state"] == "fail" for r in mine) else "")
            parts.append(f"{_cell(v)}: {len(mine)}{where}{outcome}")
        lines.append(f"  {name}: " + "; ".join(parts))
    if lines:
        lines.insert(0, "started, by value" + (" (of the points queued with it)" if grid else "")
                     + ", best validation accuracy:")
    return lines


def _failures(rows):
    """The failed rows grouped by cause, the first sentence of their messages without its
    parenthesised numbers: [(cause, rows)] in the order of their first trial."""
    groups = {}
    for r in sorted((r for r in rows if r["state"] == "fail"), key=lambda r: r["number"]):
        text = r["error"] or "no message"
        cause = re.sub(r"\s*\([^)]*\)", "", re.split(r";|\. ", text)[0]).strip()
        groups.setdefault(cause, []).append(r)
    return list(groups.items())


def _cell(v):
    if v is None:
        return "-"
    return f"{v:g}" if isinstance(v, float) else str(v)


def report(folder, png=None, echo=print):
    """Print the sweep's table (a row per trial) and the chosen trial; draw accuracy against
    each hyperparameter into `png` (default: sweep.png in the folder). Returns the rows."""
    folder = Path(folder)
    spec, rows, waiting = trial_rows(folder)
    names = sorted(spec["space"])
    fixed = spec["fixed"]
    # the figure first: a reader who cuts the table short (`report | head`) still gets it
    png = Path(png) if png is not None else folder / "sweep.png"
    try:
        axes = {n: (list(d["values"]) if "values" in d else (d["low"], d["high"], d["log"]))
                for n, d in spec["space"].items()}
        plotting.plot_sweep(rows, axes, png, title=f"{fixed['model']} on {fixed['task']}: "
                            f"{len(rows)} trials of {spec['trials']}")
        drawn = f"wrote {png}"
    except plotting.PlotUnavailable as e:
        drawn = str(e)
    echo(f"sweep {spec['study']}: {fixed['model']} on {fixed['task']}, {fixed['iterations']} "
         f"iterations, chosen on {fixed['valid_size']} validation examples; {len(rows)} trials "
         f"started, {waiting} waiting, of {spec['trials']}")
    header = ["trial", *names, "state", "iteration", "best valid", "test"]
    table = [[("*" if r["chosen"] else "") + str(r["number"]),
              *(_cell(r["params"].get(n)) for n in names), r["state"], _cell(r["iteration"]),
              "-" if r["valid"] is None else f"{r['valid']:.4f}",
              "-" if r["test"] is None else f"{r['test']:.4f}"] for r in rows]
    widths = [max(len(h), *(len(row[k]) for row in table)) if table else len(h)
              for k, h in enumerate(header)]
    echo("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in table:
        echo("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    chosen = next((r for r in rows if r["chosen"]), None)
    if chosen is None:
        echo("no trial is complete yet: nothing chosen")
    else:
        echo(f"chosen on validation: trial {chosen['number']} ({_point(chosen['params'])}), "
             f"validation accuracy {chosen['valid']:.4f}; its test accuracy (best.h5) "
             + ("-" if chosen["test"] is None else f"{chosen['test']:.4f}")
             + f"; run folder {trial_folder(folder, chosen['number'])}")
        iterations, commands = final_commands(folder, spec, chosen)
        echo(f"to train it to {iterations:,} iterations on the whole training set, one run per "
             "seed:")
        for command in commands:
            echo(f"  {command}")
    stopped = [str(n) for n in sorted(r["number"] for r in rows if r["state"] == "stopped")]
    if stopped:
        echo(f"{_trials(stopped)} left unfinished: `sweep run --out {folder}` resumes "
             f"{'them' if len(stopped) > 1 else 'it'} (from the last checkpoint, where there is "
             f"one)")
    twins = sorted((r["number"], r["twin_of"]) for r in rows if r.get("twin_of") is not None)
    if twins:
        echo("points drawn again, given the result of the trial that ran them (not trained "
             "again): " + ", ".join(f"trial {n} = trial {m}" for n, m in twins))
    for line in coverage(spec, rows):
        echo(line)
    for cause, group in _failures(rows):
        first = group[0]
        if len(group) == 1:
            echo(f"trial {first['number']} failed: {first['error'] or cause}")
        else:
            echo(f"{_trials([str(r['number']) for r in group])} failed: {cause}. The first, "
                 f"trial {first['number']}: {first['error']}")
    echo(drawn)
    return rows
