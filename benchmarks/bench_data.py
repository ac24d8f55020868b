"""What a batch costs next to the training step that consumes it.

    python benchmarks/bench_data.py [--data-dir DIR] [--tasks mnist,pmnist,mnist-noise,padded-mnist]
                                    [--synthetic cifar10,cifar10-noise] [--device cpu|cuda]

For each task: the time to open its cache when it is already built (checks included, files in
the OS's page cache), the median time to produce one training batch and one test batch of B
sequences (read the images from the HDF5 file, scale them, draw the noise), and the median time of
one training step of the antisymmetric RNN (n=128, float32, forward + BPTT, `Model.step_arrays`
as the training loop calls it) on such a batch, with the ratio batch / step.
"floor/step" is the floor under any batch: allocating a fresh float32 array of the batch's shape
and writing it once, over the same step time. "in loop" is what batches add to a run of training
steps (`Model.step_arrays`, as the training loop calls it, one wait at the end): its time with a
new batch before each step, over its time on one batch made beforehand, minus 1. On the CPU it is
about batch/step; on cuda the host makes the next batch while the GPU runs the step.
Batches and steps are timed in alternating rounds, so that both see the same machine load.
The caches are built first if needed (MNIST must be in DIR/mnist or downloadable). The
--synthetic tasks (CIFAR-10, which cannot be had everywhere) are timed on random images of their
shape: their layout and noise, all of a batch but the read from the cache. With --device cuda
the batches are made as training on cuda makes them (the noise drawn on the GPU) and the step runs
there. Prints a table; nothing is asserted (timings are not tests).
"""
import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba                                             # noqa: E402
import numpy as np                                       # noqa: E402

import nprnn                                             # noqa: E402
from nprnn.data import noise, sources  # noqa: E402
from nprnn.study.bench import machine, median_time  # noqa: E402
from nprnn.data.datasets import get_task  # noqa: E402
from nprnn.data.tasks import sequences, task_spec  # noqa: E402


def synchronizer(device):
    if device == "cuda":
        from numba import cuda
        return cuda.synchronize
    return lambda: None


def time_batches_and_step(next_train, next_test, next_loop, m, K, B, n, batches, steps,
                          device):
    """Median times (s) of a training batch, a test batch and one antisym training step on
    `device`, timed in interleaved rounds so that all three see the same machine load; the
    fraction that batches from `next_loop` (made as the training loop makes them) add to a run
    of `batches` steps; and, on the CPU, the floor under any batch: allocating and writing a
    fresh float32 array of its shape."""
    sync = synchronizer(device)
    next_train(), next_test()                            # first touch of the output memory
    model = nprnn.make_model("antisym", m, n, K, dtype="float32", device=device)
    x, y = next_train()

    def step():
        model.step_arrays(x, y)

    def run(next_batch):
        """`batches` steps, each on next_batch(), timed to the end of the last."""
        start = time.perf_counter()
        for _ in range(batches):
            model.step_arrays(*next_batch())
        sync()
        return time.perf_counter() - start

    run(lambda: (x, y))                                  # compile (cached on disk), allocate
    run(next_loop)
    train_t, test_t, step_t, added = [], [], [], []
    for _ in range(steps):
        train_t.append(median_time(next_train, batches, sync, warmup=False))
        test_t.append(median_time(next_test, batches, sync, warmup=False))
        step_t.append(median_time(step, 1, sync, warmup=False))
        fixed = run(lambda: (x, y))
        added.append(run(next_loop) / fixed - 1)
    write_s = (median_time(lambda: np.empty(x.shape, np.float32).fill(0), batches,
                           warmup=False)
               if device == "cpu" else float("nan"))
    train_s, test_s, step_s, in_loop = map(statistics.median, (train_t, test_t, step_t, added))
    return dict(train_s=train_s, test_s=test_s, step_s=step_s, write_s=write_s,
                in_loop=in_loop)


class TooFewExamples(ValueError):
    """A task has a split smaller than one batch."""


def bench_task(name, data_dir, B, n, batches, steps, T, device):
    """A task read from its cache, as training reads it."""
    get_task(name, data_dir=data_dir, T=T, progress=False).close()    # build the cache if needed
    start = time.perf_counter()
    task = get_task(name, data_dir=data_dir, T=T, progress=False)
    open_s = time.perf_counter() - start
    smallest = min(task.size("train"), task.size("test"))
    if B > smallest:                      # no whole batch: the epochs below would never yield
        task.close()
        raise TooFewExamples(f"--batch-size {B} is more than the {smallest} examples of "
                             f"{name}'s smaller split")

    def epochs(split, **kwargs):                         # one epoch after another, never ending
        return itertools.chain.from_iterable(task.batches(split, B, epoch=e, device=device,
                                                          drop_last=True, **kwargs)
                                             for e in itertools.count())
    train_iter, test_iter = epochs("train", seed=0), epochs("test")
    loop_iter = epochs("train", seed=1, reuse=device == "cuda")     # as the training loop
    r = time_batches_and_step(lambda: next(train_iter), lambda: next(test_iter),
                              lambda: next(loop_iter), task.m, task.num_classes, B, n, batches,
                              steps, device)
    task.close()
    return dict(r, task=name, T=task.T, m=task.m, open=f"{1e3 * open_s:>6.0f}ms")


def bench_synthetic(name, B, n, batches, steps, T, device):
    """A task whose raw files cannot be had here (CIFAR-10): its sequence layout applied to random
    uint8 images of its shape, with its noise keys. Everything a batch costs but reading the
    B images from the cache (about 0.3 ms for 128 MNIST digits by positioned reads)."""
    spec = task_spec(name)
    T, m = spec.shape(T)
    H, W, C = sources.SOURCES[spec.source].image_shape
    perm = np.arange(H * W)
    rng = np.random.default_rng(0)
    counter = itertools.count()
    staging = None
    if device == "cuda":
        from nprnn.core.memory import Staging
        staging = Staging()

    def batch(split, staging=None):
        images = rng.integers(0, 256, (B, H, W, C), dtype=np.uint8)
        i = next(counter)
        keys = (np.column_stack([np.full(B, 1), np.zeros(B, int), np.zeros(B, int),
                                 np.full(B, i), np.arange(B)]) if split == "train" else
                np.column_stack([np.full(B, 2), np.ones(B, int), i * B + np.arange(B)]))
        y = rng.integers(0, 10, B)
        return sequences(spec.layout, images, T, perm, keys, device, staging), y  # as batches

    r = time_batches_and_step(lambda: batch("train"), lambda: batch("test"),
                              lambda: batch("train", staging), m, 10, B, n, batches, steps,
                              device)
    return dict(r, task=name + "*", T=T, m=m, open="-")


def bench_noise(B=128, T=1000, m=28, repeats=5, device="cpu"):
    """ns per float32 N(0, 1) draw: nprnn.data.noise (keyed streams, Box-Muller) on numba's threads
    and NumPy's Generator (ziggurat) on one thread, as each is used; on cuda also nprnn.data.noise on
    the GPU."""
    x = np.zeros((B, T, m), dtype=np.float32)
    keys = np.column_stack([np.ones(B, int), np.arange(B)])
    on_gpu = None
    if device == "cuda":
        from numba import cuda
        x_gpu = cuda.device_array((B, T, m), dtype=np.float32)
        noise.fill_gaussian_device(x_gpu, 0, keys)
        on_gpu = 1e9 * median_time(lambda: noise.fill_gaussian_device(x_gpu, 0, keys), repeats,
                                   cuda.synchronize, warmup=False) / x.size
    noise.fill_gaussian(x, 0, keys)                      # compile (cached on disk)
    ours = median_time(lambda: noise.fill_gaussian(x, 0, keys), repeats, warmup=False)
    rng = np.random.default_rng(0)

    def numpy_fill():
        for b in range(B):
            rng.standard_normal(out=x[b], dtype=np.float32)
    theirs = median_time(numpy_fill, repeats, warmup=False)
    return 1e9 * ours / x.size, 1e9 * theirs / x.size, on_gpu


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None,
                        help="data directory (default: $NPRNN_DATA_DIR, else ./data)")
    parser.add_argument("--tasks", default="mnist,pmnist,mnist-noise,padded-mnist")
    parser.add_argument("--synthetic", default="cifar10,cifar10-noise",
                        help="tasks timed on random images of their shape (no raw files needed)")
    parser.add_argument("--batch-size", type=positive_int, default=128)
    parser.add_argument("--hidden", type=positive_int, default=128)
    parser.add_argument("--batches", type=positive_int, default=5,
                        help="batches timed per split and round (the median is kept)")
    parser.add_argument("--steps", type=positive_int, default=5,
                        help="rounds: each times --batches batches per split, then one step")
    parser.add_argument("--T", type=positive_int, default=None, help="T of the noise tasks")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where batches are made and steps run (cuda: batches made on the "
                             "GPU, as training on cuda makes them)")
    args = parser.parse_args()
    rows = [(bench_task, name, dict(data_dir=args.data_dir)) for name in
            filter(None, args.tasks.split(","))]
    rows += [(bench_synthetic, name, {}) for name in filter(None, args.synthetic.split(","))]
    T_of = {}                                            # --T applies to the noise tasks only
    for _, name, _ in rows:                              # a bad name or T stops before any timing
        try:
            spec = task_spec(name)
            T_of[name] = args.T if spec.noisy else None
            spec.shape(T_of[name])
        except ValueError as exc:
            parser.error(str(exc))

    if args.device == "cuda":
        from nprnn.core.device import DeviceUnavailable, resolve_device
        try:
            resolve_device("cuda")
        except DeviceUnavailable as exc:                 # say why, without a traceback
            sys.exit(f"bench_data.py: {exc}")
    print(f"device {args.device}, B={args.batch_size}, antisym n={args.hidden} float32; "
          f"{machine()}, {numba.get_num_threads()} numba threads, "
          f"load average {os.getloadavg()[0]:.1f}; medians over {args.steps} rounds of "
          f"{args.batches} batches + 1 step")
    print(f"{'task':<14} {'T':>5} {'m':>4} {'open':>8} {'train batch':>12} {'test batch':>11} "
          f"{'step':>9} {'batch/step':>11} {'floor/step':>11} {'in loop':>8}")
    for bench, name, extra in rows:
        try:
            r = bench(name, B=args.batch_size, n=args.hidden, batches=args.batches,
                      steps=args.steps, T=T_of[name], device=args.device, **extra)
        except (sources.DataError, TooFewExamples) as exc:    # say so, time the rest
            why = str(exc).replace("\n", "\n" + " " * 15)     # the whole message, indented
            print(f"{name:<14} skipped: {why}", flush=True)
            continue
        print(f"{r['task']:<14} {r['T']:>5} {r['m']:>4} {r['open']:>8} "
              f"{1e3 * r['train_s']:>10.1f}ms {1e3 * r['test_s']:>9.1f}ms "
              f"{1e3 * r['step_s']:>7.1f}ms {100 * r['train_s'] / r['step_s']:>10.1f}% "
              + (f"{100 * r['write_s'] / r['step_s']:>10.1f}%" if args.device == "cpu"
                 else f"{'-':>11}") + f" {100 * r['in_loop']:>7.1f}%",
              flush=True)
    ours, theirs, on_gpu = bench_noise(args.batch_size, args.T or 1000, repeats=args.steps,
                                      device=args.device)
    if args.synthetic:
        print("* random images of the task's shape through its layout and noise: all of a batch "
              "but reading the images from the cache")
    threads = numba.get_num_threads()
    print(f"N(0, 1) float32 draws: nprnn.data.noise {ours:.1f} ns on {threads} "
          f"thread{'s' * (threads != 1)}, numpy Generator.standard_normal {theirs:.1f} ns on "
          f"1 thread"
          + (f", nprnn.data.noise on the GPU {on_gpu:.3f} ns" if on_gpu else ""))
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
