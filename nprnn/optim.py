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
"""
import math

import numpy as np

from .kernels import optim as K_optim
from .kernels.gpu_common import copy_into, is_device_array

OPTIMIZERS = ("sgd", "adagrad")


def _flat(a, what, name):
    """A 1-d view of a C-contiguous array (a copy would silently drop the in-place update)."""
    if is_device_array(a):
        return a.reshape(a.size)
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
        raise ValueError(f"{what} {name!r} must be a C-contiguous numpy array so that it can be "
                         f"updated in place")
    return a.reshape(-1)


def _positive(label, value):
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{label} must be a finite number > 0, got {value!r}")
    return value


def global_norm(grads):
    """||g|| = sqrt(sum over all tensors and elements of g**2), accumulated in float64 so that a
    float32 gradient cannot overflow the sum. inf or nan when a gradient holds inf or nan."""
    if any(is_device_array(g) for g in grads.values()):
        from . import gpu
        total = gpu.to_device(np.zeros(1, dtype=np.float64))
        for name, g in grads.items():
            K_optim.sum_squares_gpu(total, _flat(g, "gradient", name))
        return math.sqrt(total.copy_to_host()[0])
    total = np.zeros(1, dtype=np.float64)
    for name, g in grads.items():
        K_optim.sum_squares_cpu(total, _flat(g, "gradient", name))
    return math.sqrt(total[0])


def clip_scale(norm, clip):
    """The factor s = min(1, clip / norm) that rescales the whole gradient to norm <= clip
    (Pascanu et al., 2013); clip = 0 turns clipping off (s = 1)."""
    if clip < 0:
        raise ValueError(f"clip must be >= 0 (0 turns clipping off), got {clip!r}")
    if clip == 0 or norm <= clip:
        return 1.0
    return clip / norm


def _full_like(p, value):
    """An array shaped like p, on p's device, filled with value."""
    if is_device_array(p):
        from . import gpu
        a = gpu.cuda.device_array(p.shape, dtype=p.dtype)
        gpu.fill(a, value)
        return a
    return np.full_like(p, value)


class Optimizer:
    """State per parameter in named slots: `self.slots[slot][param_name]` is an array of the
    parameter's shape and dtype. Subclasses set `name`, `slot_names`, `hyper` (the
    hyperparameters besides lr) and `_update` (one kernel call on flat arrays)."""

    name = ""
    slot_names = ()

    def __init__(self, params, lr, **hyper):
        self.lr = _positive("lr (learning rate)", lr)
        self.hyper = hyper
        self.steps = 0
        self.slots = {s: {k: _full_like(p, self._initial(s)) for k, p in params.items()}
                      for s in self.slot_names}

    def _initial(self, slot):
        return 0.0

    def step(self, params, grads, scale=1.0):
        """Update every parameter in place from its gradient (scaled by `scale`, the clipping
        factor). `params` and `grads` have the same keys as the state was built with."""
        if set(params) != set(self.slots[self.slot_names[0]]) or set(grads) != set(params):
            raise ValueError(f"params {sorted(params)} and grads {sorted(grads)} must have the "
                             f"keys the optimizer was built with: "
                             f"{sorted(self.slots[self.slot_names[0]])}")
        for k, p in params.items():
            g = grads[k]
            if g.shape != p.shape or g.dtype != p.dtype:
                raise ValueError(f"gradient {k!r} has shape {g.shape} and dtype {g.dtype}, but "
                                 f"the parameter has shape {p.shape} and dtype {p.dtype}")
            state = [_flat(self.slots[s][k], f"{self.name} state {s}", k)
                     for s in self.slot_names]
            update = self._update_gpu if is_device_array(p) else self._update
            update(_flat(p, "parameter", k), *state, _flat(g, "gradient", k), float(scale))
        self.steps += 1

    def _update(self, p, *state_and_grad_and_scale):
        raise NotImplementedError

    # -- saving and restoring ------------------------------------------------------------------
    def state_dict(self):
        """{"name", "lr", "hyper", "steps", "slots": {slot: {param: array}}}; arrays are the live
        state (the caller copies them out, e.g. into a checkpoint file)."""
        return dict(name=self.name, lr=self.lr, hyper=dict(self.hyper), steps=self.steps,
                    slots=self.slots)

    def load_state_dict(self, state):
        """Restore the state arrays (copied in place, shapes and dtypes checked) and the step
        count. The learning rate and hyperparameters stay the ones this optimizer was built with:
        a resumed run may lower the learning rate on purpose."""
        if state.get("name") != self.name:
            raise ValueError(f"optimizer state is for {state.get('name')!r}, not {self.name!r}")
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
                copy_into(live, a)
        self.steps = int(state["steps"])


class SGD(Optimizer):
    """SGD with momentum: v <- mu v + s g ; p <- p - lr v (mu = 0 is plain SGD)."""

    name = "sgd"
    slot_names = ("velocity",)

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


def make_optimizer(name, params, lr, momentum=0.9, **hyper):
    """"sgd" (SGD with momentum) or "adagrad", with state shaped like `params`."""
    if name == "sgd":
        return SGD(params, lr, momentum=momentum, **hyper)
    if name == "adagrad":
        return Adagrad(params, lr, **hyper)
    raise ValueError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
