"""How cli.py's commands print and write: the folder --out (made, or refused in a line), running
out of memory said in one line, the files of an earlier run replaced (and a stale PNG removed),
figures drawn when matplotlib is there, tables in columns, and a table piped into a reader that
stops early.
"""
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import click

from ..runs.checkpoint import FILENAME, CheckpointError, load_checkpoint
from ..runs.train import CONFIG
from ..study import plotting
from ..util.files import why_no_folder


@contextmanager
def reader_may_leave():
    """A table piped into a reader that stops early (`sweep report ... | head`): the rest of
    the output is dropped without a word, and the command exits as one ended by SIGPIPE (141),
    as other tools do, after finishing its work (the report draws its figure first)."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())        # Python's last flush has nowhere to fail
        sys.exit(128 + signal.SIGPIPE)


def out_dir(out):
    """The folder `out` as a Path, created with its parents if missing; where it cannot be,
    click.BadParameter for --out naming the path and the reason."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise click.BadParameter(f"cannot create folder {out}: {why_no_folder(path, e)}",
                                 param_hint="--out") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise click.BadParameter(f"cannot write into folder {out}: permission denied",
                                 param_hint="--out")
    return path


# ----------------------------------------------------------------------------------------------
# running out of memory
# ----------------------------------------------------------------------------------------------

def memory_error(error, lower, note=""):
    """The one-line click.ClickException for a MemoryError (numpy's _ArrayMemoryError among them:
    numpy refuses an impossible allocation at once): numpy's account of it, the options `lower`
    that shrink it, then `note` (what a failed run left behind)."""
    detail = f" ({error})" if str(error) else ""
    return click.ClickException(f"not enough memory for this size{detail}; lower {lower}{note}")


# What running out of memory looks like besides MemoryError: numpy's refusal of a shape whose
# size overflows, and PyTorch's allocators (RuntimeError; torch.OutOfMemoryError on the GPU).
OUT_OF_MEMORY = ("array is too big", "maximum allowed dimension exceeded", "out of memory",
                 "can't allocate memory")


@contextmanager
def enough_memory(lower):
    """A MemoryError inside, or a ValueError or RuntimeError that says memory ran out (numpy,
    PyTorch), becomes memory_error(e, lower)."""
    try:
        yield
    except MemoryError as e:
        raise memory_error(e, lower) from None
    except (ValueError, RuntimeError) as e:
        if not any(words in str(e).lower() for words in OUT_OF_MEMORY):
            raise
        raise memory_error(e, lower) from None


def saved_iteration(out):
    """The iteration of run folder `out`'s checkpoint, or None if it has none that loads."""
    try:
        return load_checkpoint(out / FILENAME)["progress"]["iteration"]
    except (CheckpointError, OSError, KeyError):
        return None


def left_behind(out):
    """What a `train` that failed left in its run folder `out`, and what to do with it ("" if
    nothing): train writes config.json, then the checkpoint of iteration 0, before the first
    step."""

    out, ckpt = Path(out), Path(out) / FILENAME
    if ckpt.is_file():
        at = saved_iteration(out)
        at = "" if at is None else f" (iteration {at})"
        return (f". The run folder keeps its checkpoint {ckpt}{at}: continue it with `python "
                f"cli.py train --out {out} --resume` where more memory is free (--hidden, "
                f"--batch-size and --T cannot change on resume), or delete {out} to start again "
                f"with smaller sizes")
    if (out / CONFIG).is_file():
        return f". {out} holds a {CONFIG} but no checkpoint: delete it to start again"
    return ""


def aborted(name, out):
    """What `train` says when a second signal `name` aborts it mid-step: the checkpoints are
    atomic, so the last one written in `out` stands."""
    at = saved_iteration(Path(out))
    return (f"{name} received again: aborted"
            + (f". The checkpoint of iteration {at} is kept: continue with `python "
               f"cli.py train --out {out} --resume`" if at is not None else ""))


# ----------------------------------------------------------------------------------------------
# files of an earlier run, figures, tables
# ----------------------------------------------------------------------------------------------

def say_which(done, total, label, T):
    """A line on stderr as each (model, T) of `jacobian` starts: at the defaults (and more so
    with trained models of large n) the whole takes minutes."""
    click.echo(f"[{done + 1}/{total}] {label}, T={T}", err=True)


def earlier(png, *numbers):
    """Those of the files `png`, `numbers` that an earlier run left (call it before writing them),
    deleting the earlier PNG at once: it shows the earlier numbers, and without matplotlib no new
    PNG takes its place, so kept it would disagree with the new numbers written beside it."""
    old = [p for p in (png, *numbers) if p.exists()]
    if png in old:
        png.unlink()
    return old


def replacing(old):
    """", replacing the earlier X, Y" for the paths `old` (the files this run wrote over), else
    ""."""
    return f", replacing the earlier {', '.join(map(str, old))}" if old else ""


def draw(old, png, plot, *args, indent=""):
    """Draw `png` with nprnn.study.plotting.<plot>(*args) (`png` among them) and say so; without
    matplotlib print how to get it and, where an earlier run left one (it is in `old`, from
    `earlier`, which deleted it), that it was removed. Returns the files of `old` that this run
    wrote over: the earlier PNG only if a new one was drawn."""

    try:
        getattr(plotting, plot)(*args)
    except plotting.PlotUnavailable as e:
        click.echo(str(e))
    else:
        click.echo(f"{indent}wrote {png}")
        return old
    if png in old:
        click.echo(f"{indent}removed the earlier {png}: it showed the numbers these replace")
    return [p for p in old if p != png]


def echo_table(table, left):
    """Print rows of strings in columns, the first `left` columns flush left, the rest right."""
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(f"{v:<{w}}" if k < left else f"{v:>{w}}"
                             for k, (v, w) in enumerate(zip(row, widths))).rstrip())


def results_table(rows):
    """`results`' table of analysis.run_summary's `rows`: a header, then a row of strings per
    run; a column "baseline" where a run's task has one (what a model without memory scores)."""
    baselines = any(r.get("baseline") for r in rows)
    return [("run", "model", "task", "settings", "iterations", "time", "split", "last",
             "best") + ("baseline",) * baselines] + [
        (r["name"], r["model"], r["task"], r["settings"],
         f"{r['reached']:,}" + ("" if r["planned"] is None else f" of {r['planned']:,}"),
         "-" if r["time"] is None else duration(r["time"]), r["split"],
         at(r["last"], r.get("metric")), at(r["best"], r.get("metric")))
        + (baseline(r.get("baseline"), r.get("metric")),) * baselines for r in rows]


def baseline(scores, metric):
    """A task's baseline as a results cell: "MSE 0.1667", or "92.71% (loss 0.1733)"."""
    if not scores:
        return "-"
    if metric == "mse":
        return f"MSE {scores['loss']:.4g}"
    return f"{scores['accuracy']:.2%} (loss {scores['loss']:.4f})"


def evaluation(r):
    """`eval`'s words for evaluate_checkpoint's dict `r`: the task's metric and loss, and
    what a model without memory scores where the task says."""
    if r["accuracy"] is None:
        words = f"MSE {r['loss']:.4g} over {r['count']:,} outputs"
    else:
        steps = " steps" if r.get("readout") == "every" else ""
        words = (f"accuracy {r['accuracy']:.4f} ({round(r['accuracy'] * r['count'])}/"
                 f"{r['count']}{steps}), loss {r['loss']:.4f}")
    if r.get("baseline"):
        words += "; without memory: " + ", ".join(
            f"{'MSE' if r['accuracy'] is None else k} {v:.4f}" for k, v in r["baseline"].items())
    return words


def echo_markdown(table):
    """Print rows of strings as a Markdown table, the first its header."""
    click.echo("| " + " | ".join(table[0]) + " |")
    click.echo("|" + "---|" * len(table[0]))
    for row in table[1:]:
        click.echo("| " + " | ".join(row) + " |")


def duration(seconds):
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def at(point, metric="accuracy"):
    """(iteration, value) as a results cell: "98.10% at 50,000", or "MSE 0.00123 at 2,000"."""
    if point is None:
        return "-"
    return (f"MSE {point[1]:.3g}" if metric == "mse" else f"{point[1]:.2%}") + f" at {point[0]:,}"
