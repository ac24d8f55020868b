"""One door to a saved run. `open_run(path)` reads a run folder of `train` (or one checkpoint
file) and answers what every command that studies runs asks of it: its config, its log
(metrics.jsonl), its trained model, and what it was fed (the task, its length, pmnist's
permutation, the data folder, the pixels' scaling). eval, plot, results, gates, jacobian,
criticality, the sweep report and nprnn.study.analysis all ask here, so each is decided once.

    run = open_run("runs/antisym-mnist")       # nothing is read yet
    run.config, run.records, run.model         # each read when first asked for
    with run.open_task() as task: ...          # its own task, as it was trained on it
    with run.open_task("pmnist") as task: ...  # another task of its input size
"""
import json
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ..data import datasets, tasks
from ..data.sources import DataError
from .checkpoint import CheckpointError, load_checkpoint, load_params_into, read_config_json
from .runconfig import build_model
from .runfolder import CONFIG, METRICS

# what a checkpoint's config needs to rebuild its model and name its task
NEEDED = ("model", "task", "input_size", "num_classes")


@dataclass(frozen=True)
class Feed:
    """What a run is fed: task `name` of length T (None: the task's own), pmnist's permutation
    `perm_seed` (int; None in common_feed for a task without one), the data folder `data_dir` (None: the default), pixels scaled as `pixels`; `own`
    when it is the task the run trained on."""
    name: str
    T: int | None
    perm_seed: int | None
    data_dir: str | None
    pixels: str
    own: bool

    @contextmanager
    def open(self, T=None):
        """The task, open (at length `T` instead of the Feed's, where given); a DataError
        becomes a ValueError that names the task."""
        seed = tasks.DEFAULT_PERMUTATION_SEED if self.perm_seed is None else self.perm_seed
        try:
            with datasets.get_task(self.name, data_dir=self.data_dir, seed=seed,
                                   T=self.T if T is None else T, pixels=self.pixels) as t:
                yield t
        except DataError as e:
            raise ValueError(f"task {self.name!r}: {e}") from None


class SavedRun:
    """A run folder or checkpoint file, read lazily (see the module's docstring). The model is
    rebuilt on `device` with its parameters cast to `dtype` (float64 by default, so products of
    hundreds of step Jacobians keep their digits; None keeps the dtype it was trained in)."""

    def __init__(self, path, dtype="float64", device="cpu"):
        self.path, self.dtype, self.device = Path(path), dtype, device

    @cached_property
    def checkpoint(self):
        """load_checkpoint's dict (path, config, params, progress), its config checked, and
        checked against the folder's config.json: a folder must not mix two runs."""
        saved = load_checkpoint(self.path)
        where = saved["path"]
        for key in NEEDED:
            if key not in saved["config"]:
                raise CheckpointError(f"{where} has no {key!r} in its configuration")
        config_json = self.path / CONFIG
        if config_json.is_file():
            listed = read_config_json(config_json).get("model")
            if listed != saved["config"]["model"]:
                raise CheckpointError(f"{where} is a checkpoint of model "
                                      f"{saved['config']['model']!r}, but {config_json} "
                                      f"describes model {listed!r}: the folder mixes two runs")
        return saved

    @property
    def trained(self):
        """The checkpoint's config: the settings the model was trained with."""
        return self.checkpoint["config"]

    @property
    def iteration(self):
        return self.checkpoint["progress"]["iteration"]

    @cached_property
    def config(self):
        """The folder's config.json (a run without a checkpoint yet has one), else the
        checkpoint's."""
        path = self.path / CONFIG
        if not path.is_file():
            return dict(self.trained)
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(config, dict) or "model" not in config or "task" not in config:
            raise ValueError(f"{path} must be a JSON object with keys 'model' and 'task'")
        return config

    @cached_property
    def model(self):
        config = dict(self.trained, device=self.device,
                      dtype=self.dtype or self.trained.get("dtype", "float32"))
        model = build_model(config, config["input_size"], config["num_classes"])
        params = {k: np.asarray(v, dtype=model.dtype)
                  for k, v in self.checkpoint["params"].items()}
        load_params_into(model, params, f"checkpoint {self.checkpoint['path']}")
        return model

    @cached_property
    def log(self):
        """(records, time): metrics.jsonl's records in file order, each dict(iteration, split,
        loss, accuracy) (None where absent), and the last "time" logged (the run's wall time so
        far) or None. Other keys are not read here."""
        path = self.path / METRICS
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: a run folder needs config.json and "
                                    f"metrics.jsonl (written by `python cli.py train`)")
        records, elapsed = [], None
        with open(path) as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    record, time = _record(line, f"{path}, line {lineno}")
                    records.append(record)
                    elapsed = elapsed if time is None else time
        return records, elapsed

    @property
    def records(self):
        return self.log[0]

    def records_so_far(self):
        """Every record of metrics.jsonl that parses, whole and in order, read afresh: for a run
        still being written (a sweep's trial), a line cut by a kill is skipped (train cuts it
        on resume); none before the file exists."""
        try:
            lines = (self.path / METRICS).read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    def feed(self, task=None, T=None, data_dir=None):
        """The Feed of `task` (None: the run's own, at its T unless `T` is given) from
        `data_dir` (None: the run's). ValueError where the task's input size is not the
        model's, said before its data is fetched or cached."""
        trained = self.trained
        own = task in (None, trained["task"])
        name = trained["task"] if own else task
        if T is None and own:
            T = trained.get("T")
        m = tasks.task_spec(name).shape(T)[1]
        if m != trained["input_size"]:
            raise ValueError(f"task {name!r} has input size m={m}, but {self.path} is a model "
                             f"of input size m={trained['input_size']}: give a task it was "
                             f"trained on")
        perm_seed = trained.get("perm_seed", tasks.DEFAULT_PERMUTATION_SEED) if own else (
            tasks.DEFAULT_PERMUTATION_SEED)
        return Feed(name, T, perm_seed, data_dir or trained.get("data_dir"),
                    trained.get("pixels", "unit"), own)

    def open_task(self, task=None, T=None, data_dir=None):
        """The task of `feed(task, T, data_dir)`, open (Feed.open)."""
        return self.feed(task, T, data_dir).open()


def open_run(path, dtype="float64", device="cpu"):
    """The SavedRun of a run folder or checkpoint file (nothing is read until asked for)."""
    return SavedRun(path, dtype, device)


def _record(line, where):
    """(dict(iteration, split, loss, accuracy), time or None) of one metrics.jsonl line."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    it, split = rec.get("iteration"), rec.get("split")
    if not isinstance(it, int) or isinstance(it, bool):
        raise ValueError(f"{where}: 'iteration' must be an integer, got {it!r}")
    if not isinstance(split, str):
        raise ValueError(f"{where}: 'split' must be a string such as 'train' or 'test', got "
                         f"{split!r}")
    values = {}
    for key in ("loss", "accuracy"):
        v = rec.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise ValueError(f"{where}: {key!r} must be a number, got {v!r}")
        values[key] = None if v is None else float(v)
    time = rec.get("time")
    time = float(time) if isinstance(time, (int, float)) and not isinstance(time, bool) else None
    return dict(iteration=it, split=split, **values), time


def common_feed(task, runs, data_dir=None):
    """The one Feed of task `task` that every run of `runs` (SavedRuns; none for models at
    initialisation) sees, for commands that compare them on the same sequences: pmnist's
    permutation is the one a run trained on `task` used (the default for a run of another
    task); the data folder is `data_dir` if given, else the one recorded by the first run of
    `task` (or of any task), else the default; pixels are the runs' scaling. Its perm_seed is
    None but for a permuted task. ValueError where runs would need different permutations or
    scalings."""
    pixels = {run.path: run.trained.get("pixels", "unit") for run in runs}
    if len(set(pixels.values())) > 1:
        raise ValueError("the checkpoints were trained on differently scaled pixels ("
                         + ", ".join(f"{p}: {k}" for p, k in pixels.items())
                         + "); compare models of one --pixels at a time")
    perm_seed, spec = tasks.DEFAULT_PERMUTATION_SEED, tasks.TASKS.get(task)
    if spec is not None and spec.layout == "permuted":
        seeds = {run.path: run.trained.get("perm_seed", perm_seed)
                 if run.trained["task"] == task else perm_seed for run in runs}
        if len(set(seeds.values())) > 1:
            raise ValueError(f"the checkpoints see different permutations of task {task!r} ("
                             + ", ".join(f"{p}: perm seed {k}" for p, k in seeds.items())
                             + "); compare models of one permutation at a time")
        perm_seed = next(iter(seeds.values()), perm_seed)
    else:
        perm_seed = None
    if data_dir is None:
        folders = [r.trained.get("data_dir") for r in runs if r.trained["task"] == task]
        folders += [r.trained.get("data_dir") for r in runs]
        data_dir = next((d for d in folders if d), None)
    return Feed(task, None, perm_seed, data_dir, next(iter(pixels.values()), "unit"),
                own=False)
