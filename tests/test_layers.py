"""The import graph of nprnn/ and cli.py runs one way, down the layers below: a module imports
only modules of lower layers (at the top of the file or inside a function alike), so there is no
circle, and kernels/ imports nothing of nprnn above it. A new module must be placed in a layer
here; that is where a reader learns what it may touch.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# top to bottom; each package's modules sit together (test_packages_are_layers)
LAYERS = [
    ["cli"],
    # shell/: cli.py's click building blocks that are not commands
    ["nprnn.shell"],
    ["nprnn.shell.options", "nprnn.shell.output"],  # options and their checks; printing, files
    ["nprnn"],                                  # the public API (__init__.py)
    # sweep/: searches of hyperparameters over runs (Optuna, Dask)
    ["nprnn.sweep"],
    ["nprnn.sweep.report"],                     # what a sweep found,
    ["nprnn.sweep.workers"],                    # how it runs,
    ["nprnn.sweep.study"],                      # what it is
    # study/: what trained runs did, and how fast the kernels run
    ["nprnn.study"],
    ["nprnn.study.plotting"],                   # figures of what analysis computes
    ["nprnn.study.probes"],                     # what jacobian, gates, criticality compute
    ["nprnn.study.analysis", "nprnn.study.bench"],  # dynamics, Jacobians, gates; the benchmark
    # nprnn/torch.py, the PyTorch layer: only the benchmark (its torch-layer rows) imports it
    ["nprnn.torch"],
    # runs/: a run, from its options to its folder
    ["nprnn.runs"],
    ["nprnn.runs.train"],                       # the training loop
    ["nprnn.runs.saved"],                       # one door to a saved run: open_run
    ["nprnn.runs.runconfig"],                   # a run's settings: options, model, task
    ["nprnn.runs.checkpoint", "nprnn.runs.runfolder"],  # a run folder's files and guards
    # data/: the tasks, their files and their noise
    ["nprnn.data"],
    ["nprnn.data.info"],                        # what `data info` says of a task
    ["nprnn.data.datasets"],                    # a task's batches, over its cache
    ["nprnn.data.cache"],                       # the HDF5 cache: built, checked
    ["nprnn.data.tasks"],                       # images to sequences; the registry of tasks
    ["nprnn.data.synthetic"],                   # the adding and copy tasks, drawn from keys
    ["nprnn.data.noise", "nprnn.data.sources"],
    # core/: the model, its cells and optimisers, and where their kernels run
    ["nprnn.core"],
    ["nprnn.core.model", "nprnn.core.optim", "nprnn.core.gradcheck"],
    ["nprnn.core.autotune"],                    # times the GPU kernel options
    ["nprnn.core.successors"],                  # coRNN and LEM, registered into cells
    ["nprnn.core.cells"],
    ["nprnn.core.backends"],                    # where kernels run: memory, twins, launch
    ["nprnn.core.device", "nprnn.core.reference", "nprnn.core.inputs"],
    ["nprnn.core.memory"],                      # arrays on either device; buffers, uploads
    # util/: files written whole, progress bars
    ["nprnn.util"],
    ["nprnn.util.files", "nprnn.util.progress"],
    # kernels/: the numba kernels, CPU twin above GPU twin. Every file of kernels/fast/ (a
    # family's fast GPU versions) sits above every other file of kernels/ (one per family, the
    # readout, the optimisers, ...): a new family's files take their layers with no line here.
    [f"nprnn.kernels.fast.{p.stem}" for p in sorted((ROOT / "nprnn/kernels/fast").glob("*.py"))
     if p.stem != "__init__"],
    [f"nprnn.kernels.{p.stem}" for p in sorted((ROOT / "nprnn/kernels").glob("*.py"))
     if p.stem not in ("__init__", "common", "gpu_common")],
    ["nprnn.kernels.gpu_common"],
    ["nprnn.kernels.common"],
    ["nprnn.kernels", "nprnn.kernels.fast"],    # the packages' __init__.py
]
LAYER = {module: depth for depth, modules in enumerate(LAYERS) for module in modules}


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules():
    return {module_name(p): p for p in [ROOT / "cli.py", *sorted((ROOT / "nprnn").rglob("*.py"))]}


def imports(path, name, known):
    """(line, module) for every import of an nprnn module in the file, wherever it sits."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # "from . import noise" imports the module nprnn.data.noise;
            # "from .cells import X" imports nprnn.core.cells
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found += [(node.lineno, t) for t in targets if t == "nprnn" or t.startswith("nprnn.")]
    return found


def test_only_the_torch_layer_and_the_yardstick_import_torch():
    """PyTorch is an optional extra: the library imports it in nprnn/torch.py (the layer) and in
    the benchmark's yardstick (nprnn/study/bench.py), nowhere else."""
    found = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n == "torch" or n.startswith("torch.") for n in names):
                found.add(name)
    assert found == {"nprnn.torch", "nprnn.study.bench"}


def test_every_module_has_a_layer():
    unplaced = sorted(set(modules()) - set(LAYER))
    assert not unplaced, f"place these modules in a layer of tests/test_layers.py: {unplaced}"


def upward_imports(path, name, known, layer=None):
    """The imports of the file `path`, module `name`, that run up or across the layers from its
    layer (`layer`, for a file outside nprnn: tests/test_extra_family.py places a family's)."""
    here = LAYER.get(name) if layer is None else layer
    return [f"{path.relative_to(ROOT)}:{line} imports {target} (layer {LAYER.get(target)}) "
            f"from layer {here}" for line, target in imports(path, name, known)
            if target != name and LAYER.get(target, -1) <= (len(LAYERS) if here is None else here)]


def test_imports_run_down_the_layers():
    known = modules()
    wrong = [w for name, path in known.items() for w in upward_imports(path, name, known)]
    assert not wrong, "imports that run up or across the layers:\n" + "\n".join(wrong)


@pytest.mark.parametrize("source, broken", [
    ("from .model import make_model\n", "nprnn/core/cells.py"),    # up
    ("def f():\n    from ..runs import train\n", "nprnn/data/noise.py"),  # up, in a function
    ("from .. import core\n", "nprnn/kernels/gpu_common.py"),      # out of kernels/
])
def test_the_check_catches_an_upward_import(source, broken, tmp_path, monkeypatch):
    """The check itself fails where it should: an import added upward is named."""
    path = ROOT / broken
    name = module_name(path)
    fake = tmp_path / path.name
    fake.write_text(path.read_text() + "\n" + source)
    known = modules()
    found = [t for _, t in imports(fake, name, known)]
    target = found[-1]
    assert LAYER[target] <= LAYER[name], (broken, target)


def package_of(module):
    """'nprnn.core.model' -> 'core'; 'nprnn' and 'cli' are their own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else module


def test_packages_are_layers():
    """The folders show the layers: each package's modules sit together in LAYERS, so that one
    package imports only from the packages below it."""
    order = []
    for modules_ in LAYERS:
        for package in dict.fromkeys(package_of(m) for m in modules_):
            if not order or order[-1] != package:
                order.append(package)
    repeated = sorted({p for p in order if order.count(p) > 1})
    assert not repeated, f"packages split across the layers: {repeated} (order: {order})"


ARRAY_HELPERS = {"is_device_array", "memory_of", "to_host", "copy_into", "device_array",
                 "device_copy", "pinned_array", "fill"}


def test_modules_above_the_kernels_take_array_helpers_from_memory():
    """Arrays on either device are nprnn.core.memory's business: no module above kernels/
    reaches into kernels/gpu_common.py for them (it keeps the GPU allocators that the kernels'
    own scratch memory needs, and memory.py fronts them)."""
    wrong = []
    for name, path in modules().items():
        if name.startswith("nprnn.kernels") or name == "nprnn.core.memory":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("gpu_common"):
                taken = ARRAY_HELPERS & {a.name for a in node.names}
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} {h}" for h in sorted(taken)]
            if isinstance(node, ast.Attribute) and node.attr in ARRAY_HELPERS and isinstance(
                    node.value, ast.Name) and "gpu" in node.value.id.lower():
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert not wrong, "array helpers taken from kernels/gpu_common.py: " + ", ".join(wrong)
