"""Tasks and batch iteration: the Task contract on the in-memory ArrayTask."""
import numpy as np
import pytest

from nprnn.datasets import ArrayTask


def toy_task(valid_size=0):
    rng = np.random.default_rng(0)
    return ArrayTask("toy", rng.normal(size=(50, 7, 3)), rng.integers(0, 4, 50),
                     rng.normal(size=(11, 7, 3)), rng.integers(0, 4, 11), 4,
                     valid_size=valid_size)


def test_array_task_shapes_sizes_and_dtypes():
    task = toy_task(valid_size=10)
    assert (task.T, task.m, task.num_classes) == (7, 3, 4)
    assert [task.size(s) for s in ("train", "valid", "test")] == [40, 10, 11]
    assert task.num_batches("train", 8) == 5 and task.num_batches("test", 4) == 3
    assert task.num_batches("train", 16) == 2 and task.num_batches("train", 16, drop_last=False) == 3
    x, y = next(task.batches("train", 8))
    assert x.shape == (8, 7, 3) and x.dtype == np.float32 and x.flags.c_contiguous
    assert y.shape == (8,) and y.dtype == np.int64
    assert [len(y) for _, y in task.batches("test", 4)] == [4, 4, 3]


def test_array_task_epoch_covers_train_once_and_resumes_identically():
    task = toy_task(valid_size=10)
    batches = list(task.batches("train", 8, seed=1, epoch=2))
    seen = np.concatenate([x for x, _ in batches]).reshape(40, -1)
    train_x = np.concatenate([x for x, _ in task.batches("train", 40, shuffle=False)])
    # every training example appears exactly once (sorted rows compare as sets)
    assert np.array_equal(np.unique(seen, axis=0), np.unique(train_x.reshape(40, -1), axis=0))
    resumed = list(task.batches("train", 8, seed=1, epoch=2, start=3))
    assert len(resumed) == 2
    for (xa, ya), (xb, yb) in zip(batches[3:], resumed):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert not np.array_equal(task.order("train", 1, 2), task.order("train", 1, 3))
    assert not np.array_equal(task.order("train", 1, 2), task.order("train", 2, 2))


def test_array_task_valid_split_is_held_out_and_fixed():
    a, b = toy_task(valid_size=10), toy_task(valid_size=10)
    va = next(a.batches("valid", 10))[0]
    assert np.array_equal(va, next(b.batches("valid", 10))[0])
    train = next(a.batches("train", 40, shuffle=False))[0]
    full = next(toy_task().batches("train", 50, shuffle=False))[0]
    assert sorted(map(bytes, np.concatenate([train, va]))) == sorted(map(bytes, full))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_classes=1), "num_classes"),
    (dict(valid_size=50), "valid_size"),
    (dict(y_train=np.full(50, 4)), "outside"),
    (dict(x_test=np.zeros((11, 6, 3))), "same"),
])
def test_array_task_rejects_bad_input(kwargs, match):
    rng = np.random.default_rng(0)
    args = dict(name="toy", x_train=rng.normal(size=(50, 7, 3)), y_train=rng.integers(0, 4, 50),
                x_test=rng.normal(size=(11, 7, 3)), y_test=rng.integers(0, 4, 11), num_classes=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ArrayTask(**args)


def test_batches_reject_bad_arguments():
    task = toy_task()
    with pytest.raises(ValueError, match="split"):
        task.size("validation")
    with pytest.raises(ValueError, match="batch_size"):
        task.num_batches("train", 0)
    with pytest.raises(ValueError, match="start"):
        list(task.batches("train", 8, start=99))
