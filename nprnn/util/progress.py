"""Progress on stderr, drawn by tqdm: redrawn in place on a terminal; where stderr is a file or a
pipe (a run under nohup, CI), only the lines worth keeping, which each caller chooses.

    TrainingBar(total, start)   iterations, it/s, the interval's loss and accuracy, eta; in a log,
                                one line per logging interval
    DownloadBar(name, total)    bytes; in a log, "downloading NAME (N MB) ..." and the result
    CountBar(label, total)      "evaluating test: 2,560/10,000"; in a log, nothing
    SweepBar()                  "trials: 3/12 done (1 pruned, 0 failed), 2 running, best valid
                                0.9312"; in a log, that line once a minute while it changes
"""
import math
import sys
import time

from tqdm import tqdm


def _is_terminal(stream):
    return hasattr(stream, "isatty") and stream.isatty()


class TrainingBar:
    """The training loop's bar. Disabled, it draws nothing and hands its messages (evaluations,
    a stop) to `echo`."""

    def __init__(self, total, start, stream=None, enabled=True, echo=print):
        self.stream = stream or sys.stderr
        self.enabled, self.echo = enabled, echo
        self.tty = enabled and _is_terminal(self.stream)
        self.total, self.start, self.t0 = total, start, time.perf_counter()
        self.bar = tqdm(total=total, initial=start, file=self.stream, disable=not self.tty,
                        unit="it", mininterval=0.25, smoothing=0, dynamic_ncols=True)

    @staticmethod
    def _postfix(loss, acc):
        # the interval's loss and accuracy so far, as last read (on a GPU: at the interval's
        # end); none before the first reading, no accuracy for a task scored by its MSE (nan)
        if not math.isfinite(loss):
            return ""
        return f"loss {loss:.4f}" + (f"  acc {acc:.3f}" if math.isfinite(acc) else "")

    def update(self, it, loss, acc, interval_end=False):
        if not self.enabled:
            return
        if self.tty:
            self.bar.set_description_str("", refresh=False)     # an evaluation's status ends
            self.bar.set_postfix_str(self._postfix(loss, acc), refresh=False)
            self.bar.update(it - self.bar.n)
        elif interval_end:
            elapsed = time.perf_counter() - self.t0
            self.stream.write(tqdm.format_meter(it, self.total, elapsed, ncols=100, ascii=True,
                                                postfix=self._postfix(loss, acc),
                                                initial=self.start) + "\n")
            self.stream.flush()

    def status(self, text):
        """On a terminal, `text` before the bar until the next update (an evaluation in
        progress, say); elsewhere nothing."""
        if self.tty:
            self.bar.set_description_str(text)

    def message(self, text):
        """A line of text that does not collide with the bar (`echo`'s, without a bar)."""
        if not self.enabled:
            self.echo(text)
        elif self.tty:
            self.bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self):
        self.bar.close()


class DownloadBar:
    """A download's bar; in a log, a line before it and one with the result."""

    def __init__(self, name, total, enabled=True, stream=None):
        self.name, self.total, self.enabled = name, total, enabled
        self.stream = stream or sys.stderr
        self.tty = enabled and _is_terminal(self.stream)
        self.bar = tqdm(total=total, desc=name, file=self.stream, disable=not self.tty,
                        unit="B", unit_scale=True, unit_divisor=1000, mininterval=0.1)
        if enabled and not self.tty:
            size = f" ({total / 1e6:.1f} MB)" if total else ""
            print(f"downloading {name}{size} ...", file=self.stream, flush=True)

    def update(self, done):
        self.bar.update(done - self.bar.n)

    def close(self, done, ok):
        self.bar.update(done - self.bar.n)           # the final state, however soon it came
        self.bar.close()
        if self.enabled:
            print(f"{self.name}: {'done' if ok else 'failed'}, {done / 1e6:.1f} MB",
                  file=self.stream, flush=True)


class CountBar:
    """Things done of a total, drawn only on a terminal: logs keep only the result."""

    def __init__(self, label, stream=None):
        self.label, self.stream, self.bar = label, stream or sys.stderr, None

    def __call__(self, done, total):
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.label, file=self.stream,
                            disable=not _is_terminal(self.stream), mininterval=0.25,
                            bar_format="{desc}: {n:,}/{total:,}")
        self.bar.update(done - self.bar.n)

    def message(self, text):
        """A line on stdout, above the bar where one is drawn."""
        tqdm.write(text, file=sys.stdout)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class SweepBar:
    """A sweep's trials: done of all (pruned and failed among them), running, and the best
    validation accuracy so far (nprnn.sweep.status's dict), redrawn on a terminal; elsewhere a
    line when it has changed, at most once a minute, so that a log shows the sweep alive."""

    def __init__(self, stream=None, every=60.0):
        self.stream, self.every = stream or sys.stderr, every
        self.tty = _is_terminal(self.stream)
        self.bar, self.said, self.said_at = None, None, -math.inf

    @staticmethod
    def line(s):
        best = "-" if s["best"] is None else f"{s['best']:.4f}"
        return (f"trials: {s['done']:,}/{s['total']:,} done ({s['pruned']} pruned, "
                f"{s['failed']} failed), {s['running']} running, best valid {best}")

    def __call__(self, status):
        text = self.line(status)
        if self.tty:
            if self.bar is None:
                self.bar = tqdm(total=0, file=self.stream, bar_format="{desc}")
            self.bar.set_description_str(text)
            return
        now = time.monotonic()
        if text != self.said and now - self.said_at >= self.every:
            print(text, file=self.stream, flush=True)
            self.said, self.said_at = text, now

    def message(self, text):
        """A line on stdout, above the bar where one is drawn."""
        tqdm.write(text, file=sys.stdout)

    def close(self):
        if self.bar is not None:
            self.bar.close()
