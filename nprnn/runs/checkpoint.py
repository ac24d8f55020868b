"""Checkpoints: everything a run needs to continue bit for bit, in one HDF5 file.

Layout of a checkpoint file (h5py):

    /params/<name>                  the model parameters, exact dtype and bits
    /optimizer/<slot>/<name>        the optimizer state (SGD: velocity, Adagrad: accumulator)
    attrs["format"]                 "nprnn-checkpoint", attrs["version"] = 2
    attrs["config"]                 JSON: the run's configuration (model, task, hyperparameters)
    attrs["optimizer"]              JSON: optimizer name, lr, hyperparameters, steps (calls)
    attrs["progress"]               JSON: iteration, position in the data order (epoch, batch;
                                    shown on resume, which derives them from the iteration), the
                                    evaluations done at it, the NumPy version that drew the data
                                    order, the numba, scipy and CPU of the last steps
                                    (`train._arithmetic`), wall time so far, the running sums of
                                    the logging interval in progress, and the length of
                                    metrics.jsonl when the checkpoint was written
    attrs["sha256"]                 the SHA-256 digest of all of the above (`digest`)

Floats in the JSON attributes are written with Python's repr, which reads back to the same bits.

The digest is checked at load: a checkpoint whose bytes changed on disk (a flipped bit in a
parameter turns 0.25 into 8.6e37 and still reads) is refused, not trained on. Version 1 files,
written before there was a digest, are read without that check.

Writing is atomic (`files.written_atomically`): the file is written beside its destination under
a temporary name, flushed to disk, and moved over the old checkpoint with `os.replace`, so a crash
at any moment leaves either the old checkpoint or the new one, never a torn file.
"""
import hashlib
import json
from pathlib import Path

import h5py
import numpy as np

from ..util.files import written_atomically
from ..core.memory import copy_into

FORMAT = "nprnn-checkpoint"
VERSION = 2
READS = (1, 2)                 # the versions load_checkpoint reads (1: without a digest)
FILENAME = "checkpoint.h5"
JSON_ATTRS = ("config", "optimizer", "progress")


class CheckpointError(Exception):
    """A checkpoint that is missing, unreadable, or does not fit the model it is loaded into."""


def digest(texts, arrays):
    """The SHA-256 (hex) of a checkpoint's content: `texts` {attribute: str} and `arrays`
    {path: np.ndarray}, each array by its path, dtype, shape and bytes, in sorted order."""
    h = hashlib.sha256()
    for k in sorted(texts):
        h.update(f"{k}={texts[k]}\n".encode())
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k} {a.dtype.str} {a.shape}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_checkpoint(path, params, optimizer_state, config, progress):
    """Write a checkpoint atomically to `path` (see the module docstring for the layout).

    params: {name: array}; optimizer_state: `Optimizer.state_dict()`; config, progress: JSON-able
    dicts."""
    path = Path(path)
    opt_meta = {k: v for k, v in optimizer_state.items() if k != "slots"}
    texts = dict(format=FORMAT, version=str(VERSION),
                 **{k: json.dumps(v, sort_keys=True)
                    for k, v in zip(JSON_ATTRS, (config, opt_meta, progress))})
    arrays = {f"params/{k}": np.asarray(a) for k, a in params.items()}
    arrays.update({f"optimizer/{slot}/{k}": np.asarray(a)
                   for slot, slot_arrays in optimizer_state["slots"].items()
                   for k, a in slot_arrays.items()})
    with written_atomically(path) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = VERSION
            for k in JSON_ATTRS:
                f.attrs[k] = texts[k]
            f.attrs["sha256"] = digest(texts, arrays)
            f.create_group("params")
            f.create_group("optimizer")
            for k, a in arrays.items():
                f.create_dataset(k, data=a)


def find_checkpoint(path):
    """The checkpoint file for `path`: the file itself, or `<path>/checkpoint.h5` for a run
    directory. CheckpointError names what is missing."""
    path = Path(path)
    if path.is_dir():
        ckpt = path / FILENAME
        if not ckpt.is_file():
            raise CheckpointError(f"{path} holds no checkpoint ({FILENAME} not found); is it a "
                                  f"run directory written by `python cli.py train --out {path}`?")
        return ckpt
    if path.is_file():
        return path
    raise CheckpointError(f"no such run directory or checkpoint file: {path}")


def _json_object(text, what, where):
    """The JSON object (a dict) in `text`; CheckpointError naming `what` and `where` otherwise."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: its {what} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: its {what} must be a JSON object, got "
                              f"{type(value).__name__}")
    return value


def read_config_json(path):
    """The run configuration in the JSON file `path` (a run folder's config.json), as a dict;
    CheckpointError naming the file if it cannot be read or is not a JSON object."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None
    return _json_object(text, "content", path)


def load_checkpoint(path):
    """Read a checkpoint (a file or a run directory) into
    {"params": {name: array}, "optimizer": {..., "slots": {slot: {name: array}}},
     "config": dict, "progress": dict, "path": Path}."""
    ckpt = find_checkpoint(path)
    try:
        with h5py.File(ckpt, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise CheckpointError(f"{ckpt} is an HDF5 file but not an nprnn checkpoint "
                                      f"(format attribute {f.attrs.get('format')!r})")
            version = int(f.attrs["version"])
            if version not in READS:
                raise CheckpointError(f"{ckpt} has checkpoint format version {version}; this "
                                      f"nprnn reads versions {', '.join(map(str, READS))}")
            texts = dict(format=FORMAT, version=str(version),
                         **{k: f.attrs[k] for k in JSON_ATTRS})
            arrays = {}
            f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                         if isinstance(obj, h5py.Dataset) else None)
            if version >= 2 and f.attrs["sha256"] != digest(texts, arrays):
                raise CheckpointError(f"checkpoint {ckpt} is corrupt: its content does not "
                                      f"match the digest written with it (changed on disk?)")
            optimizer, config, progress = (_json_object(texts[k], k, ckpt)
                                           for k in ("optimizer", "config", "progress"))
            params = {k: arrays[f"params/{k}"] for k in f["params"]}
            optimizer["slots"] = {s: {k: arrays[f"optimizer/{s}/{k}"] for k in f["optimizer"][s]}
                                  for s in f["optimizer"]}
            return dict(params=params, optimizer=optimizer, config=config, progress=progress,
                        path=ckpt)
    except KeyError as e:
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: missing {e}") from None
    except (OSError, RuntimeError, TypeError, ValueError, AttributeError) as e:
        # h5py's errors for a damaged file: OSError and RuntimeError ("Link iteration failed"),
        # TypeError where a link now names a datatype, not a dataset, ...
        raise CheckpointError(f"cannot read checkpoint {ckpt}: {e}") from None


def load_params_into(model, params, source="checkpoint"):
    """Copy saved parameters into `model.params` in place, after checking that they are the
    parameters of this model: the same names, shapes and dtypes. A mismatch (a checkpoint of
    another model, or of another size) raises CheckpointError naming the difference."""
    want, got = set(model.params), set(params)
    if want != got:
        raise CheckpointError(
            f"{source} does not hold the parameters of model {model.name!r}: it has "
            f"{sorted(got)}, the model has {sorted(want)} (a checkpoint of another model?)")
    for k, live in model.params.items():
        a = params[k]
        if a.shape != live.shape:
            raise CheckpointError(f"{source}: parameter {k!r} has shape {a.shape}, model "
                                  f"{model.name!r} expects {live.shape} (another hidden size, "
                                  f"input size or number of classes?)")
        if a.dtype != live.dtype:
            raise CheckpointError(f"{source}: parameter {k!r} has dtype {a.dtype}, the model "
                                  f"was built with {live.dtype}")
    for k, live in model.params.items():
        copy_into(live, params[k])          # in place, on the model's device
