"""Model import into Relax from a zoo name, an ONNX file or a ``file.py:factory`` reference.

Weights are kept out of the IRModule: ``main`` takes the inputs first (``num_input`` attribute)
and then one parameter per weight, whose values live in :attr:`ImportedModel.params`. A layout
step can thus transform weights offline (numpy in, numpy out);
:func:`altenv.graph.tasks.prepare` binds them as constants for building.

Importing a ``file.py:factory`` or a zoo model runs Python. A run keeps what it imported as
data (:func:`save_model`: the IRModule as TVM's JSON, the weights and the source framework's
outputs on seeded inputs as ``.npz``), and :func:`load_saved_model` reads it back without
running anything, so an exported run directory never executes its model's code.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import tvm
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program

from altenv.files import make_dir, replacing, write_json, write_text
from altenv.graph import zoo


class UnsupportedOperatorError(RuntimeError):
    """The frontend has no converter for some operators of the model (listed in ``ops``)."""

    def __init__(self, frontend: str, ops: list[str]) -> None:
        self.frontend = frontend
        self.ops = sorted(ops)
        super().__init__(f"{frontend} import: unsupported operator(s): {', '.join(self.ops)}")


@dataclass(frozen=True)
class InputSpec:
    """One model input: Relax parameter name, static shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class ImportedModel:
    """A model imported into Relax.

    Parameters
    ----------
    name: zoo name, ONNX file stem or factory name.
    mod: Relax IRModule; ``main(*inputs, *weights)`` with attribute ``num_input``.
    params: weight values by ``main`` parameter name, in ``main``'s order.
    inputs: the model inputs.
    source_hash: sha256 of everything that determines the model (source, options, weights).
    torch_module: the eval-mode torch module, for reference numerics (``None`` for ONNX and
        for a saved model).
    int_high: exclusive upper bound for random integer inputs (token ids).
    recorded: a saved model's reference: inputs (``random_inputs(0)``) and the torch
        module's outputs on them, taken when it was saved.
    """

    name: str
    mod: tvm.IRModule
    params: dict[str, np.ndarray]
    inputs: list[InputSpec]
    source_hash: str
    torch_module: torch.nn.Module | None = None
    int_high: int | None = None
    recorded: tuple[list[np.ndarray], list[np.ndarray]] | None = None

    @property
    def has_reference(self) -> bool:
        """Whether :meth:`reference` can check outputs (a torch module or recorded ones)."""
        return self.torch_module is not None or self.recorded is not None

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded random inputs (never zeros) matching :attr:`inputs`."""
        tensors = zoo.random_inputs([i.shape for i in self.inputs], [i.dtype for i in self.inputs],
                                    seed, self.int_high)
        return [t.numpy() for t in tensors]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Outputs of the source torch module on ``inputs``, flattened to a list (a saved
        model: the :attr:`recorded` outputs, for the recorded inputs only)."""
        if self.torch_module is None:
            if self.recorded is not None and len(inputs) == len(self.recorded[0]) and all(
                    np.array_equal(a, b) for a, b in zip(inputs, self.recorded[0])):
                return list(self.recorded[1])
            raise ValueError(f"{self.name}: no torch module to compute reference outputs")
        with torch.no_grad():
            out = self.torch_module(*(torch.from_numpy(x) for x in inputs))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        return [t.detach().numpy() for t in flat]


def load_model(source: str | Path, *, input_shapes: list[tuple[int, ...]] | None = None,
               batch: int | None = None, weights: str | Path | None = None, seed: int = 0,
               size: str = "full", **zoo_options: float | int) -> ImportedModel:
    """Import a model into Relax.

    ``source`` is a zoo name (``"resnet18"``, see :data:`zoo.ZOO`), an ``.onnx`` file, or
    ``path/to/file.py:factory`` where ``factory()`` returns ``(module, example_inputs)``.
    ``input_shapes`` overrides the example input shapes (ONNX: fixes dynamic dims);
    ``batch`` sets the leading (batch) dim of every input shape (zoo and factory models);
    ``weights`` is a torch state-dict file (zoo and factory models); ``seed`` seeds random
    weights and inputs; ``size`` and ``zoo_options`` (``width``, ...) go to :func:`zoo.get_model`.
    """
    text = str(source)
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be a positive integer, not {batch!r}")
    if text in zoo.ZOO:
        if batch is not None:
            shapes = input_shapes or zoo.ZOO[text].input_shapes[size]
            input_shapes = [(batch, *s[1:]) for s in shapes]
        module, example = zoo.get_model(text, size=size, input_shapes=input_shapes,
                                        weights=weights, seed=seed, **zoo_options)
        desc = {"zoo": text, "size": size, "options": zoo_options, "seed": seed,
                "shapes": [list(x.shape) for x in example]}
        return _from_torch(text, module, example, _hash(desc, weights), zoo.ZOO[text].int_high
                           if "vocab" not in zoo_options else int(zoo_options["vocab"]))
    if zoo_options:
        raise ValueError(f"model options {', '.join(sorted(zoo_options))}: only zoo models take "
                         "them (a file.py:factory takes input_shapes, batch and weights; an "
                         ".onnx file input_shapes)")
    if text.endswith(".onnx"):
        if weights is not None or batch is not None:
            raise ValueError("ONNX import: weights come from the file and input_shapes set "
                             "its batch; do not pass `weights` or `batch`")
        return _from_onnx(Path(text), input_shapes)
    if ".py:" in text:
        return _from_factory(text, input_shapes, batch, weights, seed)
    raise ValueError(
        f"load_model: cannot interpret source {text!r}; expected a zoo name "
        f"({', '.join(sorted(zoo.ZOO))}), a .onnx file or 'file.py:factory'"
    )


def _hash(desc: dict[str, object], *files: str | Path | None) -> str:
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode())
    for f in files:
        if f is not None:
            digest.update(Path(f).read_bytes())
    return digest.hexdigest()


def _from_factory(ref: str, input_shapes: list[tuple[int, ...]] | None, batch: int | None,
                  weights: str | Path | None, seed: int) -> ImportedModel:
    path, factory_name = ref.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location(f"altenv_user_{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"load_model: cannot import {path!r}")
    user = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user)
    torch.manual_seed(seed)
    module, example = getattr(user, factory_name)()
    example = tuple(example) if isinstance(example, (tuple, list)) else (example,)
    if weights is not None:
        module.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    module.eval()
    ints = [int(x.max()) + 1 for x in example if not x.is_floating_point()]
    int_high = max(ints) if ints else None
    if batch is not None:
        input_shapes = [(batch, *s[1:]) for s in input_shapes or [x.shape for x in example]]
    if input_shapes is not None:
        example = zoo.random_inputs(input_shapes, [str(x.dtype).removeprefix("torch.")
                                                   for x in example], seed, int_high)
    desc = {"factory": factory_name, "seed": seed, "shapes": [list(x.shape) for x in example]}
    return _from_torch(factory_name, module, example, _hash(desc, path, weights), int_high)


def _convolution(node: torch.fx.Node, importer) -> relax.Var:
    """``aten.convolution`` as TVM's importer converts it, plus the 3-D transposed case
    it refuses (``ConvTranspose3d``: "Unsupported transposed convolution dimensionality"),
    as Relax's own ``conv3d_transpose``."""
    args = importer.retrieve_args(node)
    if not (len(args) > 6 and args[6]) or len(importer.shape_of(args[0])) != 5:
        return importer._convolution(node)
    data, weight, bias, stride, pad, dilation, _, output_padding, groups = args[:9]
    out = importer.block_builder.emit(relax.op.nn.conv3d_transpose(
        data, weight, strides=stride, padding=pad, output_padding=output_padding,
        dilation=dilation, groups=groups, data_layout="NCDHW", kernel_layout="IODHW"))
    if bias is None:
        return out
    return importer.block_builder.emit(
        relax.op.add(out, relax.op.reshape(bias, (1, -1, 1, 1, 1))))


def _from_torch(name: str, module: torch.nn.Module, example: tuple[torch.Tensor, ...],
                source_hash: str, int_high: int | None) -> ImportedModel:
    with torch.no_grad():
        program = torch.export.export(module, example).run_decompositions()
    try:
        mod = from_exported_program(program, keep_params_as_input=True,
                                    run_ep_decomposition=False,
                                    custom_convert_map={"convolution.default": _convolution})
    except AssertionError as err:
        msg = str(err)
        if not msg.startswith("Unsupported function types"):
            raise
        raise UnsupportedOperatorError("torch", ast.literal_eval(msg.split(" ", 3)[3])) from err
    return _finish(name, mod, source_hash, module, int_high)


def _from_onnx(path: Path, input_shapes: list[tuple[int, ...]] | None) -> ImportedModel:
    import onnx  # with TVM's ONNX frontend 0.2 s, for ONNX models only
    from tvm.relax.frontend.onnx import from_onnx

    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if not path.is_file():  # a device such as /dev/zero would be read without end
        raise ValueError(f"{path} is not a regular file")
    model = onnx.load(str(path))
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    shape_dict, dtype_dict = {}, {}
    for k, inp in enumerate(graph_inputs):
        ttype = inp.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
        if input_shapes is not None:
            dims = list(input_shapes[k])
        if any(d is None for d in dims):
            raise ValueError(f"ONNX import: input {inp.name!r} has dynamic dims {dims}; "
                             "pass input_shapes")
        shape_dict[inp.name] = dims
        dtype_dict[inp.name] = onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type).name
    try:
        mod = from_onnx(model, shape_dict, dtype_dict, keep_params_in_input=True)
    except tvm.error.OpNotImplemented as err:
        ops = str(err).split("frontend ONNX:", 1)[1].splitlines()[0]
        raise UnsupportedOperatorError("onnx", [o.strip() for o in ops.split(",")]) from err
    desc = {"onnx": path.name, "shapes": shape_dict}
    return _finish(path.stem, mod, _hash(desc, path), None, None)


def _finish(name: str, mod: tvm.IRModule, source_hash: str, module: torch.nn.Module | None,
            int_high: int | None) -> ImportedModel:
    mod, detached = relax.frontend.detach_params(mod)
    main = mod["main"]
    num_input = int(main.attrs["num_input"])
    values = [v.numpy() for v in detached.get("main", [])]
    params = {p.name: v for p, v in zip(main.params[num_input:], values)}
    inputs = [InputSpec(p.name, tuple(int(d) for d in p.ty.shape), str(p.ty.dtype))
              for p in main.params[:num_input]]
    return ImportedModel(name, mod, params, inputs, source_hash, module, int_high)


SAVED_MODULE, SAVED_PARAMS, SAVED_INFO, SAVED_REFERENCE = (
    "module.json", "params.npz", "model.json", "reference.npz")


def save_model(model: ImportedModel, directory: str | Path) -> Path:
    """Keep ``model`` as data in ``directory``: the IRModule (``tvm.ir.save_json``), the
    weights, the inputs and, where there is a torch module, its outputs on
    ``random_inputs(0)`` (:attr:`ImportedModel.recorded`). Returns the directory."""
    out = make_dir(directory)
    write_text(out / SAVED_MODULE, tvm.ir.save_json(model.mod))
    with replacing(out / SAVED_PARAMS) as fh:
        np.savez(fh, *model.params.values())
    info = {"name": model.name, "source_hash": model.source_hash, "int_high": model.int_high,
            "params": list(model.params),
            "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype}
                       for i in model.inputs]}
    write_json(out / SAVED_INFO, info)
    if model.torch_module is not None:
        inputs = model.random_inputs(0)
        outputs = model.reference(inputs)
        with replacing(out / SAVED_REFERENCE) as fh:
            np.savez(fh, **{f"in{k}": x for k, x in enumerate(inputs)},
                     **{f"out{k}": y for k, y in enumerate(outputs)})
    return out


def load_saved_model(directory: str | Path) -> ImportedModel:
    """A model kept by :func:`save_model`, read as data (nothing is imported or run)."""
    src = Path(directory)
    info = json.loads((src / SAVED_INFO).read_text())
    mod = tvm.ir.load_json((src / SAVED_MODULE).read_text())
    with np.load(src / SAVED_PARAMS, allow_pickle=False) as stored:
        params = {name: stored[f"arr_{k}"] for k, name in enumerate(info["params"])}
    recorded = None
    if (src / SAVED_REFERENCE).exists():
        with np.load(src / SAVED_REFERENCE, allow_pickle=False) as ref:
            count = sum(1 for f in ref.files if f.startswith("in"))
            recorded = ([ref[f"in{k}"] for k in range(count)],
                        [ref[f"out{k}"] for k in range(len(ref.files) - count)])
    inputs = [InputSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in info["inputs"]]
    return ImportedModel(info["name"], mod, params, inputs, info["source_hash"],
                         int_high=info["int_high"], recorded=recorded)
