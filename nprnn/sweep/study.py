"""What a sweep is: its space of options, its folder (sweep.json), its Optuna study, storage,
sampler and pruner (successive halving). nprnn/sweep/__init__.py tells the whole story."""
import itertools
import json
import math
import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from ..util.files import temporary_name, written_atomically
from ..data.sources import DataError
from ..runs.train import (HYPERPARAMETERS, OPTIONS, SWEEP_VALID_SIZE, TrainError, build_model,
                          check_options_used, flag, load_task, resolve_config)


# Appendix C of Chang et al. (2019): the grid searched for the Euler cells
SPACES = {
    "appendix-c": dict(sigma_w=[0.0, 1.0, 2.0, 4.0, 8.0, 16.0], eps=[0.01, 0.1, 1.0],
                       gamma=[0.001, 0.01, 0.1, 1.0],
                       lr=[0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0], optimizer=["sgd", "adagrad"]),
}
# the options a space may search (the others are held fixed: they say what the run is, not how)
SEARCHABLE = ("lr", "optimizer", "momentum", "sigma_w", *HYPERPARAMETERS, "gate_bias", "w_form",
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
    built if need be, once for all trials): what its runs would say of it is a SweepError, and
    so is a task not scored by accuracy, the one measure a sweep chooses trials by."""
    if task is None:
        try:
            with load_task(fixed) as named:
                return task_shape(fixed, named)
        except (ValueError, OSError, DataError) as e:
            raise SweepError(f"task {fixed['task']}: {e}") from None
    if task.metric != "accuracy":
        raise SweepError(f"task {task.name} is scored by its {task.metric.upper()}, and a sweep "
                         f"chooses trials by validation accuracy: train its runs with "
                         f"`cli.py train` and compare them with `cli.py results`")
    return task.m, task.num_classes


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


def run_arguments(folder, given, defines=False, space=None, params=(), sampler=None,
                  trials=None, prune=False, seed=0, storage=None):
    """What `sweep run --out folder` asks of `run`: (where, definition). `given` holds the run
    options typed (name -> value), `space`, `params` (--param texts), `sampler` ... the sweep's
    own, and `defines` says whether any of those was typed. `where`: the WHERE options typed,
    resolved. The definition, `run`'s arguments for a new study: the options typed held fixed
    (valid_size VALID_SIZE unless typed), the space, the sampler (tpe where a range is searched,
    else grid), ...; it is {} where `folder` holds a study and nothing typed but WHERE options,
    so that the study goes on as defined. SweepError for an option both searched and fixed."""
    fixed = resolve_config(**dict({"valid_size": VALID_SIZE}, **given))
    where = {k: fixed[k] for k in WHERE if k in given}
    if not (defines or any(k not in WHERE for k in given)) and (Path(folder) / SWEEP).exists():
        return where, {}
    searched = make_space(space, [parse_param(p) for p in params])
    both = sorted(set(searched) & set(given))
    if both:
        raise SweepError(f"{', '.join(map(flag, both))} is both searched and held fixed: give "
                         f"it one way")
    if sampler is None:
        sampler = "tpe" if any(p.is_range for p in searched.values()) else "grid"
    return where, dict(fixed=fixed, space=searched, sampler=sampler, trials=trials, prune=prune,
                       seed=seed, storage=storage)


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
