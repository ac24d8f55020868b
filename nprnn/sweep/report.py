"""What a sweep found: a row per trial, the chosen point and the commands that train it to the
end, what the search covered, its failures by cause, and the figure."""
import re
import time
from pathlib import Path

from optuna.trial import TrialState

from ..study import plotting
from ..runs.saved import open_run
from ..runs.train import DEFAULTS, train_command
from .study import FINAL_ITERATIONS, FINAL_SEEDS, grid_points, open_sweep, space_of
from .workers import _free, _point, trial_folder


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------

def _reached(out):
    """The last iteration a trial's metrics.jsonl records, or None."""
    return next((r["iteration"] for r in reversed(open_run(out).records_so_far())
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
