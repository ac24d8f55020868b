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
processes never train one trial folder at once: a run folder's lock (nprnn.runs.train.RunLock)
refuses the second, whose driver tries that trial again later.

The package, in three rooms: study.py (what a sweep is: space, folder, study, sampler, pruner),
workers.py (how it runs: a trial on a worker, the cluster, the driver), report.py (what it
found). Their names are read through this module (`from nprnn import sweep`; `sweep.run`).
"""
# noqa: F401 (the names below are this package's API)
from .study import (SPACES, SEARCHABLE, SAMPLERS, SWEEP, JOURNAL, TRIALS, VALID_SIZE,
                    STALE_SECONDS, HEARTBEAT_SECONDS, CONNECT_SECONDS, RETRY_SECONDS, REDUCTION,
                    FORMAT, FINAL_ITERATIONS, FINAL_SEEDS, WHERE, SweepError, Param, parse_param,
                    parse_point, parse_points, enqueue, make_space, grid_points, task_shape,
                    check_space, definition, run_arguments,
                    space_of, read_sweep, open_storage, RungPruner,
                    make_pruner, waits_at_rung, make_sampler, REDRAWS, draw, load_study,
                    open_sweep)
from .workers import (trial_folder, share_cores, run_trial, local_cluster,
                      LeaveInterruptsToTheDriver, Driver, status, describe, run)
from .report import (trial_rows, final_commands, coverage, _failures, report)
