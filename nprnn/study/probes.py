"""What the commands `jacobian`, `gates` and `criticality` compute, for models at initialisation
or trained runs (opened through nprnn.runs.saved.open_run): each returns rows for the command
to print and write; the numbers themselves come from nprnn.study.analysis. The files and tables
of `simulate` and `jacobian` are written and made here too.
"""
import numpy as np

from ..runs.saved import common_feed, open_run
from ..util.progress import CountBar
from . import analysis


def _opened(paths, dtype, check):
    """(path, run, label) of each path, every run opened and `check`ed before any task is read:
    a bad checkpoint among several is said at once."""
    opened = []
    for path, folder in zip(paths, analysis.distinct_names(paths)):
        run = open_run(path, dtype)
        check(path, run)
        opened.append((path, run, analysis.checkpoint_label(run.model, folder)))
    return opened


def first_examples(batches, num):
    """The x of the first `num` examples of an iterator of (x, y) batches."""
    for x, _ in batches:
        yield x[:num]
        num -= len(x)
        if num <= 0:
            return


# ----------------------------------------------------------------------------------------------
# Figure 2: the end-to-end Jacobian dh_T/dh_0
# ----------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------------------------
# simulate: section 4's two-dimensional RNNs
# ----------------------------------------------------------------------------------------------

def write_simulation(stem, number, panels, summary):
    """Write Figure `number`'s simulation (analysis.simulation_summary's `panels`, `summary`) to
    stem.json (the summary) and stem.csv (every state h_t); return the lines that print it: its
    caption, then |h_T| / |h_0| of each panel for each initial state."""
    analysis.write_json(stem.with_suffix(".json"), summary)
    analysis.write_csv(stem.with_suffix(".csv"),
                       analysis.panels_to_rows(f"figure{number}", panels))
    lines = [f"{summary['caption']}\n  {'panel':<8} {'kind':<9} |h_T| / |h_0| for each initial "
             f"state"]
    for p in panels:
        ratios = "  ".join(f"{e / s:9.4g}" for s, e in zip(p["radius_start"], p["radius_end"]))
        panel = f"{p['key']} {p['matrix']}" if p["matrix"] else p["key"]
        lines.append(f"  {panel:<8} {p['kind']:<9} {ratios}")
    return lines


# ----------------------------------------------------------------------------------------------
# jacobian: Figure 2
# ----------------------------------------------------------------------------------------------

def jacobian(models, gammas, hidden_size, input_size, eps, sigma_w, checkpoints, task, data_dir,
             lengths, sequences, seed, dtype, progress=None):
    """Figure 2's rows for the `models` at initialisation (one per gamma where the cell has
    one), or for trained `checkpoints`, fed `sequences` per T of N(0, 1) noise or, with `task`,
    of its test sequences (the permutation and data folder the checkpoints used; the same for
    every model). Returns dict(rows, models (label, model), inputs (a sentence), input_size)."""
    opened = _opened(checkpoints, dtype, lambda path, run: None)
    built = [(label, run.model) for _, run, label in opened]
    if task:
        feed = common_feed(task, [run for _, run, _ in opened], data_dir)
        seqs = {}
        for T in lengths:
            with feed.open(T) as t:
                seqs[T] = analysis.task_sequences(t, sequences, seed=seed)
        input_size = next(iter(seqs.values())).shape[2]
        for path, run, _ in opened:
            if run.model.input_size != input_size:
                raise ValueError(f"task {task!r} has input size m={input_size}, but checkpoint "
                                 f"{path} is a model of input size m={run.model.input_size}: "
                                 f"give a task it was trained on")
        permutation = "" if feed.perm_seed is None else f" (permutation seed {feed.perm_seed})"
        source = seqs.__getitem__
        inputs = f"test sequences of task {task!r}{permutation}, drawn by seed"
    else:
        if checkpoints:
            sizes = sorted({m.input_size for _, m in built})
            if len(sizes) > 1:
                raise ValueError(f"the checkpoints have different input sizes {sizes}; compare "
                                 f"models of one input size at a time")
            input_size = sizes[0]

        def source(T):
            return analysis.gaussian_sequences(sequences, T, input_size, seed=[seed, T])
        inputs = "N(0, 1) noise, default_rng([seed, T])"
    if not checkpoints:
        built = analysis.jacobian_models(models, gammas, hidden_size, input_size, eps, sigma_w,
                                         seed, dtype)
    rows = analysis.jacobian_spectra(built, lengths, source, progress=progress)
    return dict(rows=rows, models=built, inputs=inputs, input_size=input_size)


def write_jacobian(stem, found, checkpoints, hidden_size, eps, sigma_w, sequences, seed,
                   dtype):
    """Write `jacobian`'s result `found` to stem.csv (its rows) and stem.json (the rows and the
    settings that made them; those of models at initialisation are None for `checkpoints`, and
    eps where no model has one); return the lines that print it: a row per (model, T), then the
    notes on eigenvalues at zero."""
    rows, built = found["rows"], found["models"]
    uses_eps = any(m.hyper.get("eps") is not None for _, m in built)
    analysis.write_csv(stem.with_suffix(".csv"), rows)
    analysis.write_json(stem.with_suffix(".json"), dict(
        inputs=found["inputs"], input_size=found["input_size"], checkpoints=list(checkpoints),
        hidden_size=None if checkpoints else hidden_size,
        eps=eps if uses_eps and not checkpoints else None,
        sigma_w=None if checkpoints else sigma_w, sequences=sequences, seed=seed, dtype=dtype,
        rows=rows))
    lines = [f"{'model':<28} {'T':>5} {'mean |lambda|':>14} {'std |lambda|':>13} "
             f"{'max |lambda|':>13}"]
    lines += [f"{r['label']:<28} {r['T']:>5} {r['mean']:>14.4g} {r['std']:>13.4g} "
              f"{r['max']:>13.4g}" for r in rows]
    return lines + [f"note: {note}" for note in analysis.zero_eigenvalue_notes(built, rows, dtype)]


# ----------------------------------------------------------------------------------------------
# gates: what the gates of trained models do at each step
# ----------------------------------------------------------------------------------------------

def gates(runs, task=None, T=None, data_dir=None, sequences=1000, batch_size=100, seed=0,
          say=None):
    """For each run (a folder or checkpoint of a model with gates), its gates over the first
    `sequences` test sequences (in the order `seed` shuffles) of the task it is fed, run forward
    in the dtype it was trained in: dict(label, checkpoint, model, task, T, image_steps,
    sequences (how many there were), segments (analysis.gate_segments), steps: {gate:
    dict(mean, std) per step}). `say` is told which run starts."""

    def check(path, run):
        analysis.require_gates(run.model, path)
        run.feed(task, T, data_dir)
    opened = _opened(runs, None, check)
    results = []
    for k, (path, run, label) in enumerate(opened):
        if say:
            say(f"[{k + 1}/{len(opened)}] {label}")
        with run.open_task(task, T, data_dir) as t:
            x = first_examples(t.batches("test", batch_size, seed=seed, shuffle=True), sequences)
            stats, S = analysis.gate_statistics(run.model, x)
        results.append(dict(label=label, checkpoint=str(path), model=run.model.name,
                            task=t.name, T=t.T, image_steps=t.image_steps, sequences=S,
                            segments=analysis.gate_segments(stats, t.image_steps),
                            steps={g: dict(mean=s["mean"].tolist(), std=s["std"].tolist())
                                   for g, s in stats.items()}))
    return results


def gate_step_rows(results):
    """The CSV rows of `gates`' results: a row per run, gate and step."""
    return [dict(label=r["label"], model=r["model"], task=r["task"], T=r["T"], gate=g,
                 step=t + 1, mean=s["mean"][t], std=s["std"][t])
            for r in results for g, s in r["steps"].items() for t in range(r["T"])]


def gate_table(results):
    """The printed table of `gates`' results: a row per run, gate and run of steps."""
    return [("run", "task", "gate", "steps", "mean", "std")] + [
        (r["label"], f"{r['task']} T={r['T']}", s["gate"], f"{s['first']}-{s['last']}",
         f"{s['mean']:.4f}", f"{s['std']:.4f}") for r in results for s in r["segments"]]


def fewer_sequences(label, task, found, asked):
    """The note for a task with fewer test sequences than asked for, else None."""
    if found < asked:
        return (f"note: {label}: {task} has {found:,} test sequences, fewer than --sequences "
                f"{asked:,}; all of them were used")
    return None


# ----------------------------------------------------------------------------------------------
# criticality: eq. (5)'s criterion along the trajectories of trained Euler cells
# ----------------------------------------------------------------------------------------------

def criticality(runs, task=None, T=None, data_dir=None, sequences=8, segments=8, seed=0,
                say=None):
    """For each run of an Euler cell, analysis.ode_jacobian_spectra over its first `sequences`
    test sequences (in the order `seed` shuffles), summarised over `segments` runs of steps.
    Returns (rows, each with its task, and notes)."""

    def check(path, run):
        if run.model.hyper.get("eps") is None:
            euler = ", ".join(n for n, c in analysis.CELLS.items() if "eps" in c.hyper)
            raise ValueError(f"{path} is a {run.model.name} model, not an Euler cell: the "
                             f"criterion is for {euler}")
        run.feed(task, T, data_dir)
    rows, notes = [], []
    opened = _opened(runs, "float64", check)
    for k, (path, run, label) in enumerate(opened):
        if say:
            say(f"[{k + 1}/{len(opened)}] {label}")
        with run.open_task(task, T, data_dir) as t:
            xs = np.concatenate(list(first_examples(
                t.batches("test", sequences, seed=seed, shuffle=True), sequences)))
            name = t.name
        shown = CountBar("sequences")
        try:
            rows += [dict(r, task=name) for r in analysis.ode_jacobian_spectra(
                [(label, run.model)], xs, segments, progress=shown)]
        finally:
            shown.close()
        notes.append(fewer_sequences(label, name, len(xs), sequences))
    return rows, [n for n in notes if n]


def criticality_table(rows):
    return [("run", "task", "steps", "mean", "max", "positive")] + [
        (r["label"], r["task"], f"{r['first']}-{r['last']}", f"{r['mean']:.3g}",
         f"{r['max']:.3g}", f"{r['share_growing']:.1%}") for r in rows]
