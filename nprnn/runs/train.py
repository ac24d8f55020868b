"""The training loop: batches, steps, clipping, evaluation, metrics, checkpoints, resume, signals.

One iteration is one minibatch step (Appendix C counts 50,000 of them, batch size 128):

    x, y      = the next training batch (B, T, m), (B,)      in the order the task draws from
                                                              (seed, epoch): see nprnn/data/datasets.py
                (and each row's length, for a task with them; y as the task's loss takes it)
    L, g      = model.loss_and_grad(x, y)                     full BPTT
    s         = min(1, clip / ||g||)                          gradient-norm clipping (0: s = 1)
    params   <- optimizer step with s g                       SGD with momentum or Adagrad

A run lives in a folder, runs/NAME/:

    config.json      the resolved configuration: model, task, every hyperparameter, and what the
                     task declares: readout, loss, metric (what `python cli.py eval` needs to
                     rebuild the model and the task; runs without them: last, xent, accuracy)
    metrics.jsonl    one JSON object per line: {"iteration", "split", "loss", "accuracy", ...};
                     "accuracy" null for a task scored by its MSE (its "loss");
                     split "train" for each logging interval (means over its steps, plus "lr",
                     "grad_norm", "time", "it_per_s"), "valid"/"test" for each evaluation.
                     "time" is the run's wall time so far (all its pieces, evaluations and
                     checkpoints included); "it_per_s" is iteration / time, not the interval's
    checkpoint.h5    the latest checkpoint (nprnn/runs/checkpoint.py): parameters, optimizer state,
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
    random draws are the data order (and the noise of the noise tasks), which nprnn.data.datasets
    derives from (seed, epoch, batch index), and epoch and batch follow from the iteration. So
    the seed and the checkpoint's iteration are the complete random state of a run, given the
    same NumPy: the order comes from NumPy's random Generator, whose streams NumPy does not
    promise to keep across versions. The checkpoint records the version, and resuming under
    another one says so;
  * a NaN or Inf in the loss or the gradient stops the run before the bad step is applied and
    leaves the last good checkpoint in place (TrainingDiverged names the iteration).
"""
import math
import time
from pathlib import Path

import numpy as np

from ..core import autotune
from ..core.device import cpu_model, resolve_device
from ..core.memory import Staging
from ..core.optim import OPTIMIZERS, StepRecorder
from ..data.tasks import resolve_data_dir
from ..util.progress import TrainingBar
from .checkpoint import (FILENAME, CheckpointError, load_checkpoint, load_params_into,
                         save_checkpoint)
from .saved import open_run
# a run's settings (runconfig.py) and its folder's files and guards (runfolder.py); train's
# callers (cli.py, nprnn/sweep/, the tests) read them through this module too
from .runconfig import (CHANGEABLE_ON_RESUME, DEFAULTS, HYPERPARAMETERS, OPTIONS,  # noqa: F401
                        SWEEP_VALID_SIZE, T_ALIAS, Option, _data_dir_resolved, _unused_options,
                        build_model, build_optimizer, check_named_task_fits, check_options_used,
                        check_task_fits, flag, load_task, lr_at, merge_resume_config,
                        parse_iterations, resolve_config, task_head, train_command)
from .runfolder import (BEST, CONFIG, LOCK, METRICS, MetricsLog, RunInUse,  # noqa: F401
                        RunLock, SecondSignal, StopSignals, TensorBoardLog, TrainError,
                        TrainingDiverged, last_record, write_json)



# ----------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------

def cross_entropy(logits, y):
    """Per-example softmax cross-entropy -log p[b, y_b] (B,) in float64, and the predictions."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(z).sum(axis=1))
    return log_norm - z[np.arange(len(y)), y], z.argmax(axis=1)


def score(outputs, y, loss, lengths=None):
    """(loss sum, correct, count) of one batch in float64, as the model's loss counts them.

    loss "xent": outputs (B, K) or (B, T, K) logits, y (B,) or (B, T) labels; entries where y
    is -1, or past a row's length (lengths (B,)), are not counted. loss "mse": outputs and y
    (B, K) or (B, T, K); every entry is counted, and `correct` is 0."""
    if loss == "mse":
        d = outputs.astype(np.float64) - y
        return float((d * d).sum()), 0, d.size
    y = np.array(y, dtype=np.int64)                 # a copy: the steps past a length go to -1
    if lengths is not None and y.ndim == 2:
        y[np.arange(y.shape[1]) >= np.asarray(lengths)[:, None]] = -1
    counted = y >= 0
    losses, pred = cross_entropy(outputs[counted], y[counted])
    return float(losses.sum()), int((pred == y[counted]).sum()), int(counted.sum())


def evaluate(model, task, split, batch_size=256, should_stop=None, progress=None, staging=None):
    """The mean loss of `model` over every example of a split, and its accuracy where the task
    is scored by it (`task.metric`; else None), in a fixed order (the training split too:
    unshuffled, its last short batch kept), whatever the batch size. Means are over the entries
    the loss counts: examples, or steps of an "every" readout, or outputs of "mse".

    Returns dict(loss, accuracy, count), or None if `should_stop()` became true in between
    (a stop signal during a long evaluation does not wait for it to finish). `progress`, if
    given, is called as progress(examples done, examples in all) after each batch. On cuda the
    batches go through `staging` (an nprnn.core.memory.Staging that the caller keeps from one
    evaluation to the next), else through buffers of their own."""
    if task.size(split) == 0:
        if split == "valid":
            raise TrainError(f"task {task.name!r} has no validation split: it is held out of the "
                             f"training set with --valid-size N when training starts")
        raise TrainError(f"split {split!r} of task {task.name!r} is empty")
    loss_sum, correct, count, done = 0.0, 0, 0, 0
    for x, y, lengths in task.batches(split, batch_size, shuffle=False, drop_last=False,
                                      device=model.device, reuse=_reuse(model, staging),
                                      with_lengths=True):
        if should_stop is not None and should_stop():
            return None
        batch = score(model.forward(x, lengths=lengths), y, task.loss, lengths)
        loss_sum, correct, count = loss_sum + batch[0], correct + batch[1], count + batch[2]
        done += len(y)
        if progress is not None:
            progress(done, task.size(split))
    accuracy = correct / count if task.metric == "accuracy" else None
    return dict(loss=loss_sum / count, accuracy=accuracy, count=count)


def better(res, best, metric):
    """Whether evaluation `res` beats `best` (None: nothing yet) by the task's metric: a higher
    accuracy, or a lower loss for "mse"."""
    if best is None:
        return True
    if metric == "mse":
        return res["loss"] < best["loss"]
    return res["accuracy"] > best["accuracy"]


def _reuse(model, staging):
    """Task.batches' `reuse` for a model: on cuda, `staging` if given, else buffers of the
    pass's own; on the CPU, none."""
    if model.device != "cuda":
        return False
    return True if staging is None else staging


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


def format_config(config, model):
    """The resolved configuration as aligned 'key  value' lines, the parameter count and, on
    cuda, the kernels each pass runs."""
    keys = ["model", "task", "pixels", "T", "seq_len", "readout", "loss", "hidden", "layers",
            *HYPERPARAMETERS, "sigma_w",
            "gate_bias", "w_form", "init", "optimizer", "lr", "lr_decay_at", "lr_decay",
            "momentum", "clip", "batch_size", "iterations", "seed", "perm_seed", "dtype",
            "device", "eval_every", "eval_split", "log_every", "checkpoint_every", "data_dir",
            "valid_size"]
    lines = [f"  {k:<17} {config.get(k)}" for k in keys
             if not (k == "momentum" and k not in OPTIMIZERS[config["optimizer"]].options)
             and not (k == "perm_seed" and config["task"] != "pmnist")
             and not (k == "gate_bias" and "b_z" not in model.params)
             and not (k == "w_form" and config.get(k) is None)
             # (eps and gamma are said whatever the model; the later ones where it has them)
             and not (k in HYPERPARAMETERS and k not in ("eps", "gamma")
                      and config.get(k) is None)
             and not (k == "T" and config.get(k) in (None, config.get("seq_len")))
             and not (k == "lr_decay" and not config.get("lr_decay_at"))]
    lines.append(f"  {'parameters':<17} {model.num_params():,}")
    if model.device == "cuda":      # which GPU kernels run (nprnn/core/autotune.py times them once)
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
    task:     an in-memory task to use instead of nprnn.data.datasets.get_task(config["task"], ...)
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
                for x, y, lengths in run.batches():   # the rest of this epoch, in its order
                    run.step(x, y, lengths)           # forward, full BPTT, optimizer step
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
        if final.get("accuracy") is None:         # a task scored by its MSE (the loss)
            echo(f"final test MSE after {it} iterations: {final['loss']:.4g} "
                 f"({run.prog['elapsed']:.0f} s of training)")
        else:
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
            check_task_fits(model, config, task, f"checkpoint {self.ckpt_path}")
            load_params_into(model, saved["params"], f"checkpoint {self.ckpt_path}")
        else:
            config.update(task_head(task))    # the task's, never the user's to set
            model = build_model(config, task.m, task.num_classes)
        optimizer = build_optimizer(config, model.params)
        if resume:
            try:
                optimizer.load_state_dict(saved["optimizer"])
            except ValueError as e:
                raise CheckpointError(f"checkpoint {self.ckpt_path}: {e}") from None

        # the resolved configuration: every default made explicit, as config.json records it
        eval_split = "valid" if config["valid_size"] > 0 else "test"
        config.update({k: model.hyper.get(k) for k in HYPERPARAMETERS})
        config.update(w_form=model.cell.w_form, seq_len=task.T,
                      input_size=task.m, num_classes=task.num_classes,
                      num_params=model.num_params(), eval_split=eval_split)
        if task.baseline is not None:         # what a model without memory scores (results)
            config["baseline"] = task.baseline
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
        write_json(out / CONFIG, config)

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
                                 reuse=_reuse(self.model, self.staging), with_lengths=True)

    def step(self, x, y, lengths=None):
        """One iteration: the loss and its gradient by full BPTT (from each row's length, where
        `lengths` gives them), the running totals (and the clipping factor they give), the
        optimizer's update."""
        self.last_step = step = self.model.step_arrays(x, y, lengths)
        self.recorder.record(step)
        self.optimizer.lr = lr_at(self.config, self.it)     # the schedule's, at this step
        self.optimizer.step(self.model.params, step.grads, self.recorder.scale)
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
            self.run_acc = (acc["correct"] / max(acc["count"], 1)
                            if config.get("metric", "accuracy") == "accuracy" else float("nan"))
        if interval_end:
            t = self.elapsed()
            self.log.write(iteration=it, split="train", loss=self.run_loss,
                           accuracy=None if math.isnan(self.run_acc) else self.run_acc,
                           grad_norm=acc["grad_norm_sum"] / acc["steps"],
                           lr=lr_at(config, it - 1), epoch=it / self.per_epoch, time=round(t, 3),
                           it_per_s=round(it / max(t, 1e-9), 4))
        self.bar.update(it, self.run_loss, self.run_acc, interval_end)
        if interval_end:
            self.prog["interval"] = _new_interval()
            self.recorder.reset()
        if callback is not None:
            callback(it, self.last_step.loss())
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
                final = last_record(self.out / METRICS, "test", self.it)
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
        accuracy = "" if res["accuracy"] is None else f"  accuracy {res['accuracy']:.4f}"
        self.bar.message(f"iteration {it}: {split} loss {res['loss']:.4f}{accuracy}")
        metric = self.config.get("metric", "accuracy")
        if (self.config["keep_best"] and split == "valid"
                and better(res, self.prog.get("best"), metric)):
            key = "loss" if metric == "mse" else "accuracy"
            self.prog["best"] = {"iteration": it, key: res[key]}
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
    y = zero_targets(config, x.shape[1], model.num_classes)
    step = warm.step_arrays(x, y)
    recorder = StepRecorder(warm.device, config["clip"], _new_interval())
    recorder.record(step)
    build_optimizer(config, warm.params).step(warm.params, step.grads, recorder.scale)
    recorder.read()
    warm.forward(x)
    return time.perf_counter() - t0


def zero_targets(config, T, K):
    """Targets of one row of T steps, all 0, in the form the config's loss and readout take
    (nprnn.core.model): (1,) or (1, T) labels for "xent", (1, K) or (1, T, K) for "mse"."""
    every = config.get("readout", "last") == "every"
    if config.get("loss", "xent") == "mse":
        return np.zeros((1, T, K) if every else (1, K), dtype=np.float32)
    return np.zeros((1, T) if every else (1,), dtype=np.int64)


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
    accuracy (None for a task scored by its MSE), count, iteration, model, task, T (the task's
    sequence length), split, device (the one used: cpu or cuda), checkpoint, metric, baseline
    (the task's, or None), readout)."""
    run = open_run(path, dtype=None, device=resolve_device(device))
    model, where = run.model, run.checkpoint["path"]
    config = dict(run.trained)
    trained_on = config["task"]
    if task_name is not None and task_name != trained_on:
        config["task"], config["T"] = task_name, None     # another task: its own length
    if T is not None:
        config["T"] = T
    if data_dir is not None:
        config["data_dir"] = data_dir
    owns_task = task is None
    if owns_task and config["task"] != trained_on:
        check_named_task_fits(model, run.trained, config, f"{where}, trained on {trained_on!r},")
    task = load_task(config, task)
    try:
        check_task_fits(model, run.trained, task, f"{where}, trained on {trained_on!r},")
        res = evaluate(model, task, split, batch_size or config.get("eval_batch_size", 256),
                       progress=progress)
    finally:
        if owns_task:
            task.close()
    return dict(res, iteration=run.iteration, model=model.name, task=task.name,
                T=task.T, split=split, device=model.device, checkpoint=str(where),
                metric=task.metric, baseline=task.baseline, readout=task.readout)
