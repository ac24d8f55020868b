"""The synthetic long-memory tasks: the adding problem and the copy task, drawn from keys.

adding  (T >= 2)  x_t = (u_t, a_t) for t < T: u_t ~ U[0, 1) i.i.d.; a_t = 1 at i1 and i2, else 0,
        i1 ~ uniform{0 .. T//2 - 1}, i2 ~ uniform{T//2 .. T - 1}: one marker in each half.
        y = u_{i1} + u_{i2} (B, 1), read at the last step, mean squared error. Predicting 1
        scores E[(u + u' - 1)^2] = 1/6. (coRNN's and LEM's form, as uRNN's; successors.md 3.)
adding-varlen  (T >= 4)  the adding problem on rows of their own length L ~ uniform{ceil(T/2)
        .. T}: markers one in each half of L (i1 < L//2 <= i2 < L), x_t = 0 for L <= t < T, and
        the model reads h at step L (the batch's `lengths`). Chosen as the variable-length task
        over, say, MNIST cut at random lengths: the data are free to have any length without
        losing the evidence for the label, the baseline stays 1/6 at every L (so it scores on
        the same scale as adding), and a model that ignored the lengths would read h after up to
        T/2 steps of zero input, which changes an Euler cell's state: the lengths are needed.
copy  (T >= 1, the delay)  sequences of T + 20 steps, one-hot over 10 codes (the official
        code's: data 1..8, blank 0, delimiter 9): 10 data symbols ~ uniform{1 .. 8}, T - 1
        blanks, the delimiter (step T + 9), 10 blanks. Target at every step: blank (0) for
        t < T + 10, then the 10 data symbols in order; 9 classes (the delimiter is never a
        target), per-step cross-entropy. A memoryless model scores 10 ln 8 / (T + 20): certain
        blanks, a uniform guess at the 10 recall steps. (Arjovsky et al. 2016; successors.md 4.)

Every row is drawn from its own stream of 64-bit words (nprnn/kernels/noise.py: word j of the
stream that starts at s_0 is mix(s_0 + (j + 1) gamma), s_0 the hash of the row's key,
nprnn.data.noise.stream_starts), so a row is the same on every machine and NumPy version:

    training batch:  (SYNTHETIC_TRAIN, task code, T, seed, epoch, batch index, position)
    scored example:  (SYNTHETIC_EVAL, task code, T, split code, row)

A row's words: 0 its length L (adding-varlen; else unused), 1 and 2 its markers, 3 .. T + 2 its
values u_t (adding); 0 .. 9 its symbols (copy). A word w becomes an integer in lo .. hi - 1 as
lo + w mod (hi - lo) (bias below (hi - lo) / 2^64, as in splitmix64_permutation) and a value in
[0, 1) as its top 24 bits times 2^-24 (exact in float32).
"""
import math
from dataclasses import dataclass

import numpy as np

from ..kernels import noise as K_noise
from ..kernels.common import njit
from .noise import stream_starts

# the first entry of a synthetic row's key; nprnn.data.tasks' noise keys use 1 and 2
SYNTHETIC_TRAIN, SYNTHETIC_EVAL = 3, 4
SPLIT_CODES = dict(train=0, test=1, valid=2)

TRAIN_SIZE = 100_000    # the train split's nominal size: an epoch of fresh rows (uRNN's 1e5)
EVAL_SIZE = 1_000       # rows of the fixed valid and test sets (coRNN and LEM test on 1,000)
COPY_SYMBOLS = 10       # data symbols to remember
COPY_EXTRA = 2 * COPY_SYMBOLS        # steps beside the delay: a copy row has T + 20 steps
BLANK, DELIMITER = 0, 9              # codes; data are 1..8
COPY_CODES, COPY_CLASSES = 10, 9     # inputs one-hot over 10 codes; targets blank or data
_MARKER_WORDS, _VALUE_WORD = 1, 3    # words 1, 2: markers; from word 3: values


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic task: how its rows are drawn (`layout` "adding" or "copy", `varlen`), the
    smallest T it takes, and what the model reads and is scored by (`readout`, `loss`,
    `metric`). It answers what an image task's TaskSpec does (shape, num_classes, ...)."""
    name: str
    layout: str
    summary: str
    code: int               # the task's entry in its rows' keys
    min_T: int
    varlen: bool = False

    synthetic = True
    noisy = False
    source = None

    @property
    def m(self):
        return 2 if self.layout == "adding" else COPY_CODES

    @property
    def num_classes(self):
        """K: the one regression output of adding, the 9 classes of copy."""
        return 1 if self.layout == "adding" else COPY_CLASSES

    @property
    def readout(self):
        return "last" if self.layout == "adding" else "every"

    @property
    def loss(self):
        return "mse" if self.layout == "adding" else "xent"

    @property
    def metric(self):
        return "mse" if self.layout == "adding" else "accuracy"

    def what_T_is(self):
        return "the delay" if self.layout == "copy" else "the sequence length"

    def check_T(self, T):
        """T as an int; ValueError, one line naming the range, for a missing or too small T."""
        if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < self.min_T:
            got = "none was given" if T is None else f"got T={T!r}"
            raise ValueError(f"task {self.name!r} needs T (--seq-len, {self.what_T_is()}), an "
                             f"integer >= {self.min_T}; {got}")
        return int(T)

    def shape(self, T=None):
        """(steps, m) of the task's sequences at its T: (T, 2) for adding, (T + 20, 10) for
        copy."""
        T = self.check_T(T)
        return (T + COPY_EXTRA if self.layout == "copy" else T), self.m

    def image_steps(self, T=None):
        return self.shape(T)[0]

    def baseline(self, T):
        """What a model without memory scores: adding's MSE of predicting 1 (1/6, at every
        length); copy's per-step cross-entropy 10 ln 8 / (T + 20) and its accuracy
        (T + 10 + 10/8) / (T + 20) (blanks right, one recall guess in 8 right)."""
        T = self.check_T(T)
        if self.layout == "adding":
            return dict(loss=1 / 6)
        steps = T + COPY_EXTRA
        return dict(loss=COPY_SYMBOLS * math.log(8) / steps,
                    accuracy=(steps - COPY_SYMBOLS + COPY_SYMBOLS / 8) / steps)


SPECS = {spec.name: spec for spec in [
    SyntheticSpec("adding", "adding", "the adding problem: T values, two marked (one in each "
                  "half); their sum, by MSE at the last step (coRNN, LEM)", 1, min_T=2),
    SyntheticSpec("adding-varlen", "adding", "the adding problem on rows of random length in "
                  "[ceil(T/2), T], read at each row's last step", 2, min_T=4, varlen=True),
    SyntheticSpec("copy", "copy", "the copy task: 10 symbols of 8, recalled after a delay of "
                  "T steps, cross-entropy at each of T + 20 steps (Arjovsky et al. 2016)", 3,
                  min_T=1),
]}


# ----------------------------------------------------------------------------------------------
# drawing rows
# ----------------------------------------------------------------------------------------------

@njit
def stream_words(starts, L):
    """words[b, j] = word j of the stream that starts at starts[b]: (B,) uint64 -> (B, L)."""
    words = np.empty((starts.shape[0], L), dtype=np.uint64)
    for b in range(starts.shape[0]):
        for j in range(L):
            words[b, j] = K_noise.stream_word(starts[b], j)
    return words


def _below(words, n):
    """Integers in 0 .. n - 1 (int64) from words (uint64), n an int or an int64 array."""
    return (words % np.asarray(n).astype(np.uint64)).astype(np.int64)


def _unit(words):
    """Values in [0, 1) float32 from words: the top 24 bits times 2^-24 (exact)."""
    return (words >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)


def training_keys(spec, T, seed, epoch, batch, B):
    """Keys (B, 7) of a training batch's rows (the module docstring)."""
    return np.array([[SYNTHETIC_TRAIN, spec.code, T, seed, epoch, batch, b] for b in range(B)],
                    dtype=np.uint64)


def scored_keys(spec, T, split, rows):
    """Keys (len(rows), 5) of the rows of a scored split (the module docstring)."""
    return np.array([[SYNTHETIC_EVAL, spec.code, T, SPLIT_CODES[split], r] for r in rows],
                    dtype=np.uint64).reshape(len(rows), 5)


def draw(spec, T, keys):
    """The rows keyed by keys (B, k), as the cache stores them. adding: dict(values float32
    (B, T), 0 at and after a row's length; markers int64 (B, 2) i1 < i2; and for adding-varlen
    lengths int64 (B,)); copy: dict(symbols uint8 (B, 10) in 1..8)."""
    T = spec.check_T(T)
    starts = stream_starts(np.ascontiguousarray(keys, dtype=np.uint64))
    if spec.layout == "copy":
        words = stream_words(starts, COPY_SYMBOLS)
        return dict(symbols=(1 + _below(words, 8)).astype(np.uint8))
    words = stream_words(starts, _VALUE_WORD + T)
    lengths = T - _below(words[:, 0], T // 2 + 1) if spec.varlen else np.full(len(keys), T)
    half = lengths // 2
    i1 = _below(words[:, _MARKER_WORDS], half)
    i2 = half + _below(words[:, _MARKER_WORDS + 1], lengths - half)
    values = _unit(words[:, _VALUE_WORD:])
    values[np.arange(T) >= lengths[:, None]] = 0
    drawn = dict(values=values, markers=np.stack([i1, i2], axis=1))
    if spec.varlen:
        drawn["lengths"] = lengths.astype(np.int64)
    return drawn


def sequences(spec, T, drawn):
    """(x float32 (B, steps, m), y, lengths) of drawn rows (`draw`'s dict, or rows of it).

    adding: x[b, t] = (u_t, a_t), y (B, 1) float32 = u_{i1} + u_{i2}; lengths (B,) int64 for
    adding-varlen, else None. copy: x one-hot (B, T + 20, 10), y (B, T + 20) int64, None."""
    T = spec.check_T(T)
    if spec.layout == "copy":
        symbols = drawn["symbols"].astype(np.int64)
        B, steps = len(symbols), T + COPY_EXTRA
        codes = np.full((B, steps), BLANK, dtype=np.int64)
        codes[:, :COPY_SYMBOLS] = symbols
        codes[:, T + COPY_SYMBOLS - 1] = DELIMITER
        x = np.zeros((B, steps, COPY_CODES), dtype=np.float32)
        np.put_along_axis(x, codes[:, :, None], 1.0, axis=2)
        y = np.full((B, steps), BLANK, dtype=np.int64)
        y[:, T + COPY_SYMBOLS:] = symbols
        return x, y, None
    values, markers = drawn["values"], drawn["markers"]
    B = len(values)
    x = np.zeros((B, T, 2), dtype=np.float32)
    x[:, :, 0] = values
    rows = np.arange(B)[:, None]
    x[rows, markers, 1] = 1.0
    y = values[rows, markers].sum(axis=1, dtype=np.float32)[:, None]
    return x, y, drawn.get("lengths")


def check_drawn(spec, T, drawn):
    """None if `drawn` (a split of the cache) holds rows the task can have, else the reason:
    markers one in each half of the row's length, values in [0, 1) and 0 past the length,
    lengths in [ceil(T/2), T]; copy's symbols in 1..8."""
    if spec.layout == "copy":
        s = drawn["symbols"]
        return None if s.size == 0 or (s.min() >= 1 and s.max() <= 8) else (
            "holds symbols outside 1..8")
    values, (i1, i2) = drawn["values"], drawn["markers"].T
    lengths = drawn["lengths"] if spec.varlen else np.full(len(values), T)
    if len(lengths) and (lengths.min() < T - T // 2 or lengths.max() > T):
        return f"holds lengths outside [{T - T // 2}, {T}]"
    half = lengths // 2
    if not (np.all(0 <= i1) and np.all(i1 < half) and np.all(half <= i2)
            and np.all(i2 < lengths)):
        return "holds markers that are not one in each half of the row"
    past = np.arange(T) >= lengths[:, None]
    if np.any(values[past] != 0) or np.any(values < 0) or np.any(values >= 1):
        return "holds values outside [0, 1) or past a row's length"
    return None
