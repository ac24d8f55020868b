"""Optimizers: updates checked against numbers worked out by hand, clipping, the antisymmetric W
kept strictly upper triangular, state saved and restored, and a tiny batch learned by heart."""
import math

import numpy as np
import pytest

import nprnn
from nprnn.core.optim import (SGD, Adagrad, Adam, StepRecorder, clip_scale, global_norm,
                              make_optimizer)
from nprnn.core.model import Step


def test_sgd_momentum_matches_hand_computed_steps():
    # p = [1, -2], g = [0.5, 1] every step, lr = 0.1, momentum 0.9:
    #   step 1: v = [0.5, 1.0]                 p = [1 - 0.05, -2 - 0.1]   = [0.95, -2.1]
    #   step 2: v = [0.45 + 0.5, 0.9 + 1]      p = [0.95 - 0.095, -2.1 - 0.19] = [0.855, -2.29]
    #   step 3: v = [0.855 + 0.5, 1.71 + 1]    p = [0.855 - 0.1355, -2.29 - 0.271]
    p = {"w": np.array([1.0, -2.0])}
    g = {"w": np.array([0.5, 1.0])}
    opt = SGD(p, lr=0.1, momentum=0.9)
    expected_p = [[0.95, -2.1], [0.855, -2.29], [0.7195, -2.561]]
    expected_v = [[0.5, 1.0], [0.95, 1.9], [1.355, 2.71]]
    for ep, ev in zip(expected_p, expected_v):
        opt.step(p, g)
        np.testing.assert_allclose(p["w"], ep, rtol=0, atol=1e-14)
        np.testing.assert_allclose(opt.slots["velocity"]["w"], ev, rtol=0, atol=1e-14)
    assert opt.steps == 3


def test_sgd_momentum_zero_is_plain_sgd_and_scale_multiplies_gradient():
    p = {"w": np.array([[1.0, 2.0], [3.0, 4.0]])}
    opt = SGD(p, lr=0.5, momentum=0.0)
    opt.step(p, {"w": np.array([[1.0, -1.0], [2.0, 0.0]])}, scale=0.5)
    # p - lr * scale * g = p - 0.25 g
    np.testing.assert_allclose(p["w"], [[0.75, 2.25], [2.5, 4.0]], rtol=0, atol=1e-15)


def test_sgd_momentum_with_a_clipping_scale_matches_hand_computed_steps():
    # the scale s multiplies the gradient entering the velocity, not the stored velocity:
    # p = [2], lr = 0.1, momentum 0.9; g = [4] with s = 0.5, then g = [1] with s = 0.25:
    #   step 1: v = 0.9 * 0 + 0.5 * 4 = 2            p = 2 - 0.2 = 1.8
    #   step 2: v = 0.9 * 2 + 0.25 * 1 = 2.05        p = 1.8 - 0.205 = 1.595
    p = {"w": np.array([2.0])}
    opt = SGD(p, lr=0.1, momentum=0.9)
    for g, s, ep, ev in [(4.0, 0.5, 1.8, 2.0), (1.0, 0.25, 1.595, 2.05)]:
        opt.step(p, {"w": np.array([g])}, scale=s)
        np.testing.assert_allclose(p["w"], [ep], rtol=0, atol=1e-14)
        np.testing.assert_allclose(opt.slots["velocity"]["w"], [ev], rtol=0, atol=1e-14)


def test_adagrad_matches_hand_computed_steps():
    # G0 = 0.1, delta = 1e-7, lr = 0.1; gradients [0.3, -0.4] then [0.1, 0.2]:
    #   step 1: G = [0.1 + 0.09, 0.1 + 0.16] = [0.19, 0.26]
    #           p = [1 - 0.1*0.3/(sqrt(0.19)+d), 0 + 0.1*0.4/(sqrt(0.26)+d)]
    #   step 2: G = [0.19 + 0.01, 0.26 + 0.04] = [0.2, 0.3]
    d = 1e-7
    p = {"w": np.array([1.0, 0.0])}
    opt = Adagrad(p, lr=0.1, initial_accumulator=0.1, delta=d)
    opt.step(p, {"w": np.array([0.3, -0.4])})
    p1 = [1 - 0.03 / (math.sqrt(0.19) + d), 0.04 / (math.sqrt(0.26) + d)]
    np.testing.assert_allclose(opt.slots["accumulator"]["w"], [0.19, 0.26], rtol=0, atol=1e-15)
    np.testing.assert_allclose(p["w"], p1, rtol=0, atol=1e-14)
    opt.step(p, {"w": np.array([0.1, 0.2])})
    p2 = [p1[0] - 0.01 / (math.sqrt(0.2) + d), p1[1] - 0.02 / (math.sqrt(0.3) + d)]
    np.testing.assert_allclose(opt.slots["accumulator"]["w"], [0.2, 0.3], rtol=0, atol=1e-15)
    np.testing.assert_allclose(p["w"], p2, rtol=0, atol=1e-14)


def test_adagrad_accumulates_the_clipped_gradient():
    # scale 0.5: G = 0 + (0.5 * 2)^2 = 1, p = 0 - 1 * 1 / (1 + 0) ... with delta 1e-7
    p = {"w": np.zeros(1)}
    opt = Adagrad(p, lr=1.0, initial_accumulator=0.0, delta=1e-7)
    opt.step(p, {"w": np.array([2.0])}, scale=0.5)
    assert opt.slots["accumulator"]["w"][0] == 1.0
    assert p["w"][0] == pytest.approx(-1.0 / (1.0 + 1e-7), abs=1e-15)


def test_adam_matches_its_formula_and_torch():
    """Three steps with clipping factors, against Adam written out in NumPy (bias corrections
    1 - b^t) and, where PyTorch is installed, torch.optim.Adam on the same clipped gradients."""
    rng = np.random.default_rng(8)
    p0 = rng.standard_normal(5)
    grads = [rng.standard_normal(5) for _ in range(3)]
    scales = [1.0, 0.5, 0.25]
    p = {"w": p0.copy()}
    opt = Adam(p, lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6)
    w, m, v = p0.copy(), np.zeros(5), np.zeros(5)
    for t, (g, s) in enumerate(zip(grads, scales), start=1):
        opt.step(p, {"w": g}, scale=s)
        m = 0.8 * m + 0.2 * s * g
        v = 0.99 * v + 0.01 * (s * g) ** 2
        w = w - 0.01 * (m / (1 - 0.8 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-6)
        np.testing.assert_allclose(p["w"], w, rtol=1e-13)
        np.testing.assert_allclose(opt.slots["m"]["w"], m, rtol=1e-13)
        np.testing.assert_allclose(opt.slots["v"]["w"], v, rtol=1e-13)
    torch = pytest.importorskip("torch", reason="PyTorch is the optional torch extra")
    theirs = torch.tensor(p0, requires_grad=True)
    torch_opt = torch.optim.Adam([theirs], lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    for g, s in zip(grads, scales):
        theirs.grad = torch.from_numpy(s * g)
        torch_opt.step()
    np.testing.assert_allclose(p["w"], theirs.detach().numpy(), rtol=1e-13)


def test_adam_settings_are_checked():
    p = {"w": np.zeros(2)}
    with pytest.raises(ValueError, match=r"beta2 must be in \[0, 1\), got 1.0"):
        Adam(p, lr=0.1, beta2=1.0)
    with pytest.raises(ValueError, match="eps"):
        Adam(p, lr=0.1, eps=0.0)


def test_float32_update_agrees_with_float64():
    rng = np.random.default_rng(0)
    p64 = {"w": rng.standard_normal(50)}
    p32 = {"w": p64["w"].astype(np.float32)}
    g64 = rng.standard_normal(50)
    for name in ("sgd", "adagrad"):
        a, b = make_optimizer(name, p64, 0.1), make_optimizer(name, p32, 0.1)
        for _ in range(3):
            a.step(p64, {"w": g64})
            b.step(p32, {"w": g64.astype(np.float32)})
        assert p32["w"].dtype == np.float32
        np.testing.assert_allclose(p32["w"], p64["w"], rtol=1e-5, atol=1e-6)


def test_global_norm_and_clip_scale():
    grads = {"a": np.array([3.0]), "b": np.array([[0.0, 4.0]], dtype=np.float32)}
    assert global_norm(grads) == 5.0
    assert clip_scale(5.0, 1.0) == pytest.approx(0.2)
    assert clip_scale(5.0, 10.0) == 1.0          # already short enough
    assert clip_scale(5.0, 0.0) == 1.0           # clipping off
    for clip in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match=f"clip must be a finite number >= 0.*got {clip}"):
            clip_scale(5.0, clip)
    # float32 squares that would overflow a float32 sum are accumulated in float64
    big = {"a": np.full(4, 1e20, dtype=np.float32)}
    assert global_norm(big) == pytest.approx(2e20, rel=1e-6)
    assert math.isnan(global_norm({"a": np.array([1.0, np.nan])}))
    assert math.isinf(global_norm({"a": np.array([np.inf])}))
    # a gradient that is not finite: nan, which skips the step, clipping on or off
    assert all(math.isnan(clip_scale(norm, c)) for norm in (math.inf, math.nan) for c in (0, 1))


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam"])
def test_an_infinite_gradient_with_clipping_leaves_the_parameters_alone(name):
    """s = clip / inf would be 0, and the update 0 * inf = nan."""
    p = {"w": np.ones(3)}
    opt = make_optimizer(name, p, lr=0.1)
    g = {"w": np.array([1.0, np.inf, 1.0])}
    opt.step(p, g, clip_scale(global_norm(g), 1.0))
    assert np.array_equal(p["w"], np.ones(3))
    assert all(np.isfinite(s["w"]).all() for s in opt.slots.values())


def test_clipped_step_has_the_clipped_length():
    p = {"a": np.zeros(2), "b": np.zeros(1)}
    g = {"a": np.array([3.0, 0.0]), "b": np.array([4.0])}
    opt = SGD(p, lr=1.0, momentum=0.0)
    opt.step(p, g, clip_scale(global_norm(g), 1.0))
    assert math.hypot(*p["a"], *p["b"]) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("name", ["antisym", "antisym-gated"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_antisymmetric_W_stays_strictly_upper_triangular(name, optimizer):
    model = nprnn.make_model(name, 2, 6, 3, eps=0.5, gamma=0.1, dtype="float64", seed=1)
    opt = make_optimizer(optimizer, model.params, lr=0.3)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((4, 5, 2)), rng.integers(0, 3, size=4)
    lower = np.tril(np.ones((6, 6), dtype=bool))        # on and below the diagonal
    W0 = model.params["W"].copy()
    for _ in range(5):
        _, grads = model.loss_and_grad(x, y)
        assert np.all(grads["W"][lower] == 0.0)
        opt.step(model.params, grads)
    W = model.params["W"]
    assert np.all(W[lower] == 0.0)
    assert not np.array_equal(W[~lower], W0[~lower])    # the upper triangle did move
    untouched = opt.hyper.get("initial_accumulator", 0.0)
    for slot in opt.slot_names:
        assert np.all(opt.slots[slot]["W"][lower] == untouched)


@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.5), ("adagrad", 0.1), ("adam", 0.02)])
def test_one_tiny_batch_is_learned_by_heart(optimizer, lr):
    model = nprnn.make_model("antisym", 2, 16, 4, eps=0.5, gamma=0.01, dtype="float64", seed=0)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 6, 2)), rng.integers(0, 4, size=8)
    opt = make_optimizer(optimizer, model.params, lr=lr)
    first, _ = model.loss_and_grad(x, y)
    for _ in range(300):
        loss, grads = model.loss_and_grad(x, y)
        opt.step(model.params, grads)
    assert loss < 0.05 < first
    assert np.array_equal(model.forward(x).argmax(axis=1), y)


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam"])
def test_state_dict_round_trip_continues_identically(name):
    rng = np.random.default_rng(4)
    p = {"W": rng.standard_normal((3, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
    q = {k: v.copy() for k, v in p.items()}
    grads = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p.items()}
             for _ in range(4)]
    a = make_optimizer(name, p, lr=0.1)
    for g in grads[:2]:
        a.step(p, g)
    saved = a.state_dict()
    b = make_optimizer(name, q, lr=0.1)
    for k in q:
        q[k][...] = p[k]
    b.load_state_dict(saved)
    assert b.steps == 2
    for g in grads[2:]:
        a.step(p, g)
        b.step(q, g)
    for k in p:
        assert p[k].tobytes() == q[k].tobytes()
    # the state_dict is a snapshot: the steps since left it as it was, and it restores `a`
    later = a.state_dict()["slots"]
    a.load_state_dict(saved)
    for slot, d in saved["slots"].items():
        for k in d:
            assert np.array_equal(a.slots[slot][k], d[k])
            assert not np.array_equal(d[k], later[slot][k])
    assert a.steps == 2


def test_load_state_dict_rejects_state_of_another_shape_or_optimizer():
    p = {"W": np.zeros((2, 2))}
    sgd = SGD(p, lr=0.1)
    with pytest.raises(ValueError, match="'sgd', not 'adagrad'"):
        Adagrad(p, lr=0.1).load_state_dict(sgd.state_dict())
    other = SGD({"W": np.zeros((3, 3))}, lr=0.1).state_dict()
    with pytest.raises(ValueError, match=r"velocity/W has shape \(3, 3\)"):
        sgd.load_state_dict(other)
    with pytest.raises(ValueError, match="must hold the parameters"):
        sgd.load_state_dict(SGD({"V": np.zeros(2)}, lr=0.1).state_dict())


def test_a_state_that_does_not_fit_leaves_the_optimizer_as_it_was():
    """Every array is checked before any is copied: before, the slots checked before the
    mismatch were overwritten, and the step count was not."""
    small = {"a": np.zeros(3), "b": np.zeros(2)}
    saved = Adagrad(small, lr=0.1).state_dict()
    saved["slots"]["accumulator"]["a"][:] = 7.0
    saved["steps"] = 5
    opt = Adagrad({"a": np.zeros(3), "b": np.zeros(5)}, lr=0.1)
    before = opt.state_dict()
    with pytest.raises(ValueError, match=r"accumulator/b has shape \(2,\)"):
        opt.load_state_dict(saved)
    after = opt.state_dict()
    assert after["steps"] == before["steps"] == 0
    assert all(np.array_equal(after["slots"]["accumulator"][k], v)
               for k, v in before["slots"]["accumulator"].items())
    for steps in (-1, 2.0, None):
        with pytest.raises(ValueError, match="'steps' must be an integer >= 0"):
            Adagrad(small, lr=0.1).load_state_dict(dict(saved, steps=steps))


def test_a_clipping_factor_must_be_a_number_at_least_zero_or_nan():
    """An infinite scale wrote inf into the parameters; a negative one climbed the gradient."""
    for bad in (math.inf, -1.0, np.array([-0.5])):
        p = {"w": np.ones(3)}
        with pytest.raises(ValueError, match=r"scale \(the clipping factor\) must be a finite "
                                             r"number >= 0, or nan"):
            SGD(p, lr=0.1).step(p, {"w": np.ones(3)}, bad)
        assert np.array_equal(p["w"], np.ones(3))
    p = {"w": np.ones(3)}
    SGD(p, lr=0.5, momentum=0.0).step(p, {"w": np.ones(3)}, 0.0)    # 0: a step of length 0
    assert np.array_equal(p["w"], np.ones(3))


def test_parameters_are_checked_when_the_optimizer_is_built_and_gradients_need_not_be_contiguous():
    with pytest.raises(ValueError, match="needs at least one parameter; params is empty"):
        make_optimizer("sgd", {}, lr=0.1)
    fortran = {"W": np.zeros((3, 2), order="F")}
    with pytest.raises(ValueError, match="parameter 'W' must be a C-contiguous"):
        make_optimizer("sgd", fortran, lr=0.1)
    g = np.arange(16.0).reshape(4, 4)[:, ::2]            # a strided gradient: read, not written
    assert global_norm({"g": g}) == pytest.approx(np.sqrt((g ** 2).sum()))
    p = {"g": np.zeros((4, 2))}
    SGD(p, lr=1.0, momentum=0.0).step(p, {"g": g})
    np.testing.assert_array_equal(p["g"], -g)


def test_bad_arguments_are_named():
    p = {"w": np.zeros(3)}
    with pytest.raises(ValueError, match="lr .* > 0, got 0.0"):
        SGD(p, lr=0.0)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\), got 1.0"):
        SGD(p, lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match="unknown optimizer 'adamw'; choose one of: sgd, "
                                         "adagrad, adam"):
        make_optimizer("adamw", p, lr=0.1)
    with pytest.raises(ValueError, match="initial_accumulator"):
        Adagrad(p, lr=0.1, initial_accumulator=-1)
    with pytest.raises(ValueError, match=r"adagrad has no momentum \(got momentum=0.5\)"):
        make_optimizer("adagrad", p, lr=0.1, momentum=0.5)
    opt = SGD(p, lr=0.1)
    with pytest.raises(ValueError, match="gradient 'w' has shape"):
        opt.step(p, {"w": np.zeros(4)})
    with pytest.raises(ValueError, match="must have the keys"):
        opt.step(p, {"v": np.zeros(3)})
    other = {"w": np.zeros(6)}                    # same name, another size: not its state
    with pytest.raises(ValueError, match=r"parameter 'w' \(\(6,\), float64, host\) is not the one "
                                         r"this optimizer was built for \(\(3,\), float64"):
        opt.step(other, {"w": np.zeros(6)})
    strided = {"w": np.zeros(6)[::2]}
    with pytest.raises(ValueError, match="C-contiguous"):
        SGD(strided, lr=0.1).step(strided, {"w": np.zeros(3)})
    frozen = {"w": np.zeros(3)}
    frozen["w"].flags.writeable = False
    with pytest.raises(ValueError, match="parameter 'w' is read-only"):
        SGD(frozen, lr=0.1).step(frozen, {"w": np.zeros(3)})
    with pytest.raises(ValueError, match="scale must be a number or a float64 array"):
        opt.step(p, {"w": np.zeros(3)}, scale=np.ones(2))


def test_a_nan_scale_skips_the_step():
    for opt in (SGD({"w": np.ones(3)}, lr=0.1), Adagrad({"w": np.ones(3)}, lr=0.1)):
        p = {"w": np.ones(3)}
        opt.step(p, {"w": np.full(3, 2.0)}, scale=np.array([np.nan]))
        assert np.array_equal(p["w"], np.ones(3))
        assert all(np.array_equal(s["w"], np.full(3, opt._initial(k)))
                   for k, s in opt.slots.items())


def step(losses, logits, y, grads, weights=None):
    """A model.Step of these arrays (weights: 1/R for each row when not given)."""
    R = logits.shape[0] if np.ndim(logits) == 2 else len(losses)
    return Step(losses, grads, logits, y, np.full(R, 1.0 / R) if weights is None else weights)


def test_step_recorder_sums_what_the_loop_reports_and_sets_the_clipping_factor():
    rec = StepRecorder("cpu", clip=1.0, totals=dict(steps=2, count=8, correct=3, loss_sum=4.0,
                                                      grad_norm_sum=1.5))
    losses = np.array([0.5, 1.0, 1.5], dtype=np.float32)
    logits = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]], dtype=np.float32)
    y = np.array([2, 0, 2])                      # row 0: a tie, the first largest (1) counts
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}        # ||g|| = 5
    rec.record(step(losses, logits, y, grads))
    got = rec.read()
    assert got == dict(steps=3, count=11, correct=5, loss_sum=7.0, grad_norm_sum=6.5,
                       first_bad=None, bad_loss=0.0, bad_norm=0.0)
    assert rec.scale[0] == pytest.approx(0.2) and global_norm(grads) == 5.0
    rec.reset()
    rec.clip = 0.0
    rec.record(step(losses, logits, y, grads))
    assert rec.scale[0] == 1.0 and rec.read()["steps"] == 1
    rec.record(step(losses * np.float32(np.inf), logits, y, grads))    # a bad step, then a good
    rec.record(step(losses, logits, y, grads))
    got = rec.read()
    assert (got["steps"], got["first_bad"], got["count"]) == (3, 2, 3)
    assert got["bad_loss"] == np.inf and got["bad_norm"] == 5.0 and np.isnan(rec.scale[0])
    with pytest.raises(ValueError, match="clip must be a finite number >= 0"):
        StepRecorder("cpu", clip=-1.0)


def test_step_recorder_counts_only_the_rows_that_count():
    """Rows of weight 0 (a label -1, a step past a row's length) add neither to the count, the
    correct answers nor the loss; a regression's y (R, K) adds no correct answers."""
    rec = StepRecorder("cpu")
    logits = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    losses = np.array([0.5, 2.0, 4.0])
    rec.record(step(losses, logits, np.array([0, -1, 0]), {"a": np.ones(1)},
                    np.array([0.5, 0.0, 0.5])))
    got = rec.read()
    assert (got["count"], got["correct"], got["loss_sum"]) == (2, 2, 4.5)
    rec.reset()
    rec.record(step(losses, logits, np.zeros((3, 2)), {"a": np.ones(1)}))
    got = rec.read()
    assert (got["count"], got["correct"], got["loss_sum"]) == (3, 0, 6.5)


def test_step_recorder_refuses_a_step_whose_shapes_disagree():
    """The record kernel reads R = logits.shape[0] losses, labels and weights without bounds
    checks: a shorter losses or y was read past its end, and the garbage marked the run bad."""
    rec = StepRecorder("cpu")
    grads = {"a": np.ones(3)}
    logits, losses, y = np.zeros((4, 10)), np.ones(4), np.zeros(4, dtype=np.int64)
    for bad, match in [((np.ones(1), logits, y), r"losses \(1,\), outputs \(4, 10\), y \(4,\)"),
                       ((losses, logits, y[:2]), r"y \(2,\)"),
                       ((losses, logits[0], y), r"outputs \(10,\)"),
                       ((losses, logits, y.astype(np.float64)), "integer labels, got dtype "
                                                                "float64")]:
        with pytest.raises(ValueError, match=match):
            rec.record(step(*bad, grads, weights=np.full(4, 0.25)))
    with pytest.raises(ValueError, match=r"weights \(2,\)"):
        rec.record(step(losses, logits, y, grads, weights=np.ones(2)))
    assert rec.read()["steps"] == 0
    rec.record(step(losses, logits, y, grads))
    assert rec.read()["steps"] == 1 and rec.read()["first_bad"] is None
