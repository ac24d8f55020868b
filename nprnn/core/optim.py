"""The two optimizers of the paper (section 5, Appendix C): SGD with momentum and Adagrad.

An optimizer is a few arrays of state per parameter and an in-place update (the math, element by
element, is in `nprnn/kernels/optim.py`):

    SGD with momentum        v <- mu v + s g ;           p <- p - lr v
    Adagrad (Duchi 2011)     G <- G + (s g)^2 ;          p <- p - lr s g / (sqrt(G) + delta)

where s = min(1, c / ||g||) is the gradient-norm clipping factor over all parameters together
(`clip_scale`; s = 1 without clipping). The state is plain arrays with the parameter's shape and
dtype, so it can be saved and restored exactly (`state_dict` / `load_state_dict`): a resumed run
continues bit for bit.

    opt = make_optimizer("sgd", model.params, lr=0.1, momentum=0.9)
    loss, grads = model.loss_and_grad(x, y)
    opt.step(model.params, grads, clip_scale(global_norm(grads), clip=1.0))

That is the plain way. On a cuda model it makes the host wait for the GPU at every step
(`global_norm` reads the norm back, and a number as the scale is uploaded afresh); a loop on the
GPU keeps the norm and the clipping factor there with a `StepRecorder`, as `train` does.
"""
import math

import numpy as np

from ..kernels import optim as K_optim
from .memory import copy_into, device_array, fill, is_device_array, memory_of, to_host
from .memory import to_device



def _flat(a, what, name):
    """A 1-d view of a C-contiguous array that is updated in place (a parameter, a state array:
    a copy would silently drop the update)."""
    if is_device_array(a):
        return a.reshape(a.size)
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
        raise ValueError(f"{what} {name!r} must be a C-contiguous numpy array so that it can be "
                         f"updated in place")
    if not a.flags.writeable:
        raise ValueError(f"{what} {name!r} is read-only (a memory map, say), and the step "
                         f"updates it in place: pass a writable copy, np.array(...)")
    return a.reshape(-1)


def _flat_read(g):
    """A 1-d array of g's values, for reading only (a gradient): a view where g is C-contiguous,
    else a contiguous copy."""
    if is_device_array(g):
        return g.reshape(g.size)
    return np.ascontiguousarray(g).reshape(-1)


def _positive(label, value):
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{label} must be a finite number > 0, got {value!r}")
    return value


def _add_squares(total, grads):
    """total[0] += ||g||^2 over every tensor of grads; total is a float64 (1,) array on the
    gradients' device."""
    add = K_optim.sum_squares_gpu if is_device_array(total) else K_optim.sum_squares_cpu
    for g in grads.values():
        add(total, _flat_read(g))


def global_norm(grads):
    """||g|| = sqrt(sum over all tensors and elements of g**2), accumulated in float64 so that a
    float32 gradient cannot overflow the sum. inf or nan when a gradient holds inf or nan."""
    total = np.zeros(1, dtype=np.float64)
    if any(is_device_array(g) for g in grads.values()):
        total = to_device(total)
    _add_squares(total, grads)
    return math.sqrt(to_host(total)[0])


def _scale_array(scale, on_device):
    """The clipping factor as the kernels take it: a float64 array (1,) where the parameters are."""
    if is_device_array(scale) or isinstance(scale, np.ndarray):
        if scale.shape != (1,) or scale.dtype != np.float64 or is_device_array(scale) != on_device:
            raise ValueError(f"scale must be a number or a float64 array of shape (1,) on the "
                             f"parameters' device; got {scale.dtype} {scale.shape} "
                             f"{'on the GPU' if is_device_array(scale) else 'in host memory'}")
        if isinstance(scale, np.ndarray):
            _check_scale(scale[0])
        return scale
    a = np.array([_check_scale(scale)], dtype=np.float64)
    if on_device:
        return to_device(a)
    return a


def _check_scale(scale):
    """A clipping factor is a number >= 0 (nan: skip the step); returned as a float. (One on
    the GPU is StepRecorder's, computed there, and not read back to be checked.)"""
    s = float(scale)
    if not (math.isnan(s) or 0.0 <= s < math.inf):
        raise ValueError(f"scale (the clipping factor) must be a finite number >= 0, or nan to "
                         f"skip the step; got {s!r}")
    return s


def clip_scale(norm, clip):
    """The factor s = min(1, clip / norm) that rescales the whole gradient to norm <= clip
    (Pascanu et al., 2013); clip = 0 turns clipping off (s = 1). A norm that is not finite (a
    gradient holding inf or nan) gives s = nan, which makes `Optimizer.step` skip the step: with
    s = clip / inf = 0 the update would compute 0 * inf = nan into the parameters."""
    if not (clip >= 0 and math.isfinite(clip)):
        raise ValueError(f"clip must be a finite number >= 0 (0 turns clipping off), got "
                         f"{clip!r}")
    if not math.isfinite(norm):
        return math.nan
    return K_optim.clip_factor(float(norm), float(clip))


def _full_like(p, value):
    """An array shaped like p, on p's device, filled with value."""
    if is_device_array(p):
        a = device_array(p.shape, p.dtype)
        fill(a, value)
        return a
    return np.full_like(p, value)


class Optimizer:
    """State per parameter in named slots: `self.slots[slot][param_name]` is an array of the
    parameter's shape and dtype, on its device. Subclasses set `name`, `slot_names`, `hyper`
    (the hyperparameters besides lr), and `_update` and `_update_gpu` (one kernel call on flat
    arrays, on the CPU and on the GPU). `steps` counts the calls of `step`, skipped steps too."""

    name = ""
    slot_names = ()

    def __init__(self, params, lr, **hyper):
        self.lr = _positive("lr (learning rate)", lr)
        if not params:
            raise ValueError("an optimizer needs at least one parameter; params is empty")
        for k, p in params.items():
            _flat(p, "parameter", k)                # updated in place: C-contiguous, writable
        self.hyper = hyper
        self.steps = 0
        self.slots = {s: {k: _full_like(p, self._initial(s)) for k, p in params.items()}
                      for s in self.slot_names}

    def _initial(self, slot):
        return 0.0

    def step(self, params, grads, scale=1.0):
        """Update every parameter in place from its gradient (scaled by `scale`, the clipping
        factor: a number, or a float64 array of one element on the parameters' device, as
        `StepRecorder.scale`; NaN skips the step). `params` and `grads` have the same keys as
        the state was built with."""
        if set(params) != set(self.slots[self.slot_names[0]]) or set(grads) != set(params):
            raise ValueError(f"params {sorted(params)} and grads {sorted(grads)} must have the "
                             f"keys the optimizer was built with: "
                             f"{sorted(self.slots[self.slot_names[0]])}")
        for k, p in params.items():
            g = grads[k]
            if g.shape != p.shape or g.dtype != p.dtype:
                raise ValueError(f"gradient {k!r} has shape {g.shape} and dtype {g.dtype}, but "
                                 f"the parameter has shape {p.shape} and dtype {p.dtype}")
            for s in self.slot_names:           # the kernels do not check bounds
                a = self.slots[s][k]
                if (a.shape, a.dtype, memory_of(a)) != (p.shape, p.dtype, memory_of(p)):
                    raise ValueError(
                        f"parameter {k!r} ({p.shape}, {p.dtype}, {memory_of(p)}) is not the one "
                        f"this optimizer was built for ({a.shape}, {a.dtype}, {memory_of(a)}); "
                        f"build a new optimizer for these parameters")
        on_device = is_device_array(next(iter(params.values())))
        scale = _scale_array(scale, on_device)
        for k, p in params.items():
            g = grads[k]
            state = [_flat(self.slots[s][k], f"{self.name} state {s}", k)
                     for s in self.slot_names]
            update = self._update_gpu if on_device else self._update
            update(_flat(p, "parameter", k), *state, _flat_read(g), scale)
        self.steps += 1

    def _update(self, p, *state_and_grad_and_scale):
        raise NotImplementedError

    def _update_gpu(self, p, *state_and_grad_and_scale):
        raise NotImplementedError

    # -- saving and restoring ------------------------------------------------------------------
    def state_dict(self):
        """{"name", "lr", "hyper", "steps", "slots": {slot: {param: array}}}, the arrays copied
        to host memory: a snapshot, which later steps leave as it is."""
        return dict(name=self.name, lr=self.lr, hyper=dict(self.hyper), steps=self.steps,
                    slots=to_host(self.slots))

    def load_state_dict(self, state):
        """Restore the state arrays (copied in place, shapes and dtypes checked) and the step
        count. The learning rate and hyperparameters stay the ones this optimizer was built with:
        a resumed run may lower the learning rate on purpose."""
        if state.get("name") != self.name:
            raise ValueError(f"optimizer state is for {state.get('name')!r}, not {self.name!r}")
        steps = state.get("steps")
        if (isinstance(steps, (bool, np.bool_)) or not isinstance(steps, (int, np.integer))
                or steps < 0):
            raise ValueError(f"optimizer state 'steps' must be an integer >= 0, got {steps!r}")
        # every array is checked before any is copied: a state that does not fit leaves this
        # optimizer as it was
        checked = []
        for s in self.slot_names:
            saved = state["slots"].get(s)
            if saved is None or set(saved) != set(self.slots[s]):
                raise ValueError(f"{self.name} state slot {s!r} must hold the parameters "
                                 f"{sorted(self.slots[s])}; got "
                                 f"{None if saved is None else sorted(saved)}")
            for k, live in self.slots[s].items():
                a = np.asarray(saved[k])
                if a.shape != live.shape or a.dtype != live.dtype:
                    raise ValueError(f"{self.name} state {s}/{k} has shape {a.shape} and dtype "
                                     f"{a.dtype}; expected {live.shape} and {live.dtype}")
                checked.append((live, a))
        for live, a in checked:
            copy_into(live, a)
        self.steps = int(steps)


class SGD(Optimizer):
    """SGD with momentum: v <- mu v + s g ; p <- p - lr v (mu = 0 is plain SGD)."""

    name = "sgd"
    slot_names = ("velocity",)
    options = ("momentum",)              # what a run's configuration sets
    settings = ()                        # what only code sets

    def __init__(self, params, lr, momentum=0.9):
        momentum = float(momentum)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        super().__init__(params, lr, momentum=momentum)

    def _update(self, p, v, g, scale):
        K_optim.sgd_momentum_cpu(p, v, g, self.lr, self.hyper["momentum"], scale)

    def _update_gpu(self, p, v, g, scale):
        K_optim.sgd_momentum_gpu(p, v, g, self.lr, self.hyper["momentum"], scale)


class Adagrad(Optimizer):
    """Adagrad (Duchi, Hazan & Singer, 2011), diagonal form:
    G <- G + (s g)^2 ; p <- p - lr s g / (sqrt(G) + delta).

    G starts at `initial_accumulator` (0.1, as in TensorFlow's Adagrad) so the first steps are not
    a sign-like jump of size lr on every weight; delta guards the division."""

    name = "adagrad"
    slot_names = ("accumulator",)
    options = ()
    settings = ("initial_accumulator", "delta")

    def __init__(self, params, lr, initial_accumulator=0.1, delta=1e-7):
        initial_accumulator = float(initial_accumulator)
        if not math.isfinite(initial_accumulator) or initial_accumulator < 0:
            raise ValueError(f"initial_accumulator must be a finite number >= 0, got "
                             f"{initial_accumulator!r}")
        delta = _positive("delta", delta)
        super().__init__(params, lr, initial_accumulator=initial_accumulator, delta=delta)

    def _initial(self, slot):
        return self.hyper["initial_accumulator"]

    def _update(self, p, G, g, scale):
        K_optim.adagrad_cpu(p, G, g, self.lr, self.hyper["delta"], scale)

    def _update_gpu(self, p, G, g, scale):
        K_optim.adagrad_gpu(p, G, g, self.lr, self.hyper["delta"], scale)


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015) as torch.optim.Adam (no weight decay, no amsgrad):
    m <- b1 m + (1 - b1) s g ; v <- b2 v + (1 - b2) (s g)^2 ;
    p <- p - (lr / (1 - b1^t)) m / (sqrt(v / (1 - b2^t)) + eps), t counting the steps from 1.

    The optimizer of coRNN's and LEM's papers, at PyTorch's defaults b1 = 0.9, b2 = 0.999,
    eps = 1e-8. A step skipped for a non-finite loss (s NaN) leaves p, m and v as they were but
    still counts in t (PyTorch's GradScaler does not count it): the bias corrections differ from
    PyTorch's only after such a step."""

    name = "adam"
    slot_names = ("m", "v")
    options = ()
    settings = ("beta1", "beta2", "eps")

    def __init__(self, params, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        for label, b in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= float(b) < 1.0:
                raise ValueError(f"{label} must be in [0, 1), got {b!r}")
        super().__init__(params, lr, beta1=float(beta1), beta2=float(beta2),
                         eps=_positive("eps", eps))

    def _corrections(self):
        t = self.steps + 1                  # this step's t (`step` counts it after the update)
        h = self.hyper
        return 1.0 - h["beta1"] ** t, math.sqrt(1.0 - h["beta2"] ** t)

    def _update(self, p, m, v, g, scale):
        h = self.hyper
        K_optim.adam_cpu(p, m, v, g, self.lr, h["beta1"], h["beta2"], h["eps"],
                         *self._corrections(), scale)

    def _update_gpu(self, p, m, v, g, scale):
        h = self.hyper
        K_optim.adam_gpu(p, m, v, g, self.lr, h["beta1"], h["beta2"], h["eps"],
                         *self._corrections(), scale)


# name -> class; each class's `options` are the run options (train's config, the CLI) it reads
OPTIMIZERS = {cls.name: cls for cls in (SGD, Adagrad, Adam)}


def make_optimizer(name, params, lr, **options):
    """The optimizer `name` (a key of OPTIMIZERS: "sgd", SGD with momentum 0.9 unless given;
    "adagrad"; "adam") with state shaped like `params`; `options` are its own (`cls.options`)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
    cls = OPTIMIZERS[name]
    for key, value in options.items():
        if key not in cls.options + cls.settings and value is not None:
            owners = [n for n, c in OPTIMIZERS.items() if key in c.options]
            raise ValueError(f"{name} has no {key} (got {key}={value!r})"
                             + (f"; it is an option of {', '.join(owners)}" if owners else ""))
    return cls(params, lr, **{k: v for k, v in options.items() if v is not None})


class StepRecorder:
    """The training loop's bookkeeping, on the parameters' device: per step, ||g||^2, then
    `kernels/optim.py`'s record_step (the clipping factor into `scale`, the step's loss, correct
    answers and ||g|| into running totals). `read()` is the only copy to the host; the loop calls
    it when it reports, evaluates or saves, so on the GPU no other step waits for the device.

        rec = StepRecorder(model.device, clip=1.0)
        step = model.step_arrays(x, y)               # device arrays on cuda
        rec.record(step)
        opt.step(model.params, step.grads, rec.scale)   # skipped from a non-finite step on
        totals = rec.read()                          # steps, count, correct, loss_sum, ...
    """

    FIELDS = K_optim.STAT_NAMES[:K_optim.FIRST_BAD]     # the running totals

    def __init__(self, device, clip=0.0, totals=None):
        if clip < 0 or not math.isfinite(clip):
            raise ValueError(f"clip must be a finite number >= 0 (0 turns clipping off), got "
                             f"{clip!r}")
        self.device, self.clip = device, float(clip)
        self._stats = np.zeros(K_optim.STATS, dtype=np.float64)
        self.scale = np.ones(1, dtype=np.float64)
        self._total = np.zeros(1, dtype=np.float64)
        if device == "cuda":
            self._stats, self.scale, self._total = (to_device(a) for a in
                                                    (self._stats, self.scale, self._total))
        self.reset(totals)

    def reset(self, totals=None):
        """Start new running totals, from `totals` (a dict of FIELDS, as read() gives) or 0."""
        stats = np.zeros(K_optim.STATS, dtype=np.float64)
        for k, name in enumerate(self.FIELDS):
            stats[k] = (totals or {}).get(name, 0)
        copy_into(self._stats, stats)

    def record(self, step):
        """Account for one step (a model.Step, arrays on the device) and set `scale` for its
        update: its losses (R,), outputs (R, K), y (R,) integer labels or (R, K) targets, weights
        (R,) and grads."""
        losses, logits, y, w = step.losses, step.outputs, step.y, step.weights
        self._check_step(losses, logits, y, w)
        if self.device == "cuda":
            fill(self._total, 0.0)
            record = K_optim.record_step_gpu
        else:
            self._total[0] = 0.0
            record = K_optim.record_step_cpu
        _add_squares(self._total, step.grads)
        record(self._stats, self.scale, losses, logits, y, w, self._total, self.clip)

    def _check_step(self, losses, logits, y, w):
        """The kernels have no bounds checks: they read R = logits.shape[0] rows of each."""
        R = logits.shape[0] if len(logits.shape) == 2 else None
        fits = y.shape in ((R,), tuple(logits.shape))
        if R is None or losses.shape != (R,) or w.shape != (R,) or not fits:
            raise ValueError(f"need losses (R,), outputs (R, K), y (R,) or (R, K) and weights "
                             f"(R,); got losses {losses.shape}, outputs {logits.shape}, y "
                             f"{y.shape}, weights {w.shape}")
        if len(y.shape) == 1 and np.dtype(y.dtype).kind not in "iu":
            raise ValueError(f"y must hold integer labels, got dtype {y.dtype}")
        where = memory_of(self._stats)
        for name, a in (("losses", losses), ("outputs", logits), ("y", y), ("weights", w)):
            if memory_of(a) != where:
                raise ValueError(f"{name} is in {memory_of(a)} memory; this recorder runs on "
                                 f"the {self.device} device and needs it in {where} memory")

    def read(self):
        """The running totals: dict of FIELDS (ints for the counts), plus `first_bad` (None, or
        the 1-based step count of the first step with a non-finite loss or gradient, which was
        not applied, nor any after it) with its `bad_loss` and `bad_norm`."""
        stats = to_host(self._stats)
        out = {name: stats[k] for k, name in enumerate(self.FIELDS)}
        for name in ("steps", "count", "correct"):
            out[name] = int(out[name])
        bad = int(stats[K_optim.FIRST_BAD])
        out.update(first_bad=bad or None, bad_loss=float(stats[K_optim.BAD_LOSS]),
                   bad_norm=float(stats[K_optim.BAD_NORM]))
        return out
