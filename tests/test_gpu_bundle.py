"""The CUDA check's CPU half: PyTorch calls that match the operators, and a bundle that holds
compiled kernels, consistent arrays and TVM's runtime (the GPU half needs a GPU machine)."""

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch

from altenv.bench import gpu
from altenv.ops import LayoutTemplate, generate


@pytest.mark.parametrize("spec", [
    "gmm:M=8,N=12,K=16",
    "gmm:M=8,N=12,K=16,batch=2",
    "c2d:N=1,I=4,O=8,H=9,W=9,KH=3,KW=3,stride=2,pad=1",
    "dep:C=8,H=9,W=9,KH=3,KW=3,stride=2,pad=1",
    "grp:I=8,O=8,groups=2,H=6,W=6,KH=3,KW=3,dilation=2,pad=2",
])
def test_torch_call_computes_the_operators_reference(spec):
    program = generate(spec)
    raw = program.random_inputs(3)
    call = gpu.torch_call(program)
    data, weight = (torch.from_numpy(raw[k]).double() for k in ("data", "weight"))
    fn = torch.matmul if call["fn"] == "matmul" else getattr(torch.nn.functional, call["fn"])
    got = fn(data, weight, **call["kwargs"]).numpy()
    np.testing.assert_allclose(got, program.reference(raw), rtol=1e-5, atol=1e-5)


def test_torch_call_refuses_transposed_convolutions():
    with pytest.raises(ValueError, match="convolutions and GEMMs"):
        gpu.torch_call(generate("t2d:I=4,O=4,H=5,W=5,KH=3,KW=3"))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the bundle's kernels are built by nvcc")
def test_bundle_holds_sources_cubins_and_arrays(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "_runtime", lambda out: (out / "lib").mkdir())  # no download
    spec = "gmm:M=16,N=32,K=16"
    manifest = gpu.build_bundle({"g": spec}, tmp_path, layouts=2, loops=2, log=lambda *a: None)
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    (entry,) = manifest["workloads"]
    assert entry["candidates"] and entry["shapes"] == {"data": [16, 16], "weight": [16, 32]}
    template = LayoutTemplate(spec)
    for cand in entry["candidates"]:
        # the library keeps its kernels' CUDA source (length-prefixed); the runtime will
        # ask for that source's binary, which the bundle holds under its hash
        lib = (tmp_path / "g" / cand["lib"]).read_bytes()
        at = lib.find(b"\n#ifdef __CUDACC_RTC__")
        source = lib[at:at + int.from_bytes(lib[at - 8:at], "little")]
        assert b"__global__" in source and source.rstrip().endswith(b"}")
        cubin = tmp_path / "cubin" / f"{hashlib.sha256(source).hexdigest()}.cubin"
        assert cubin.read_bytes()[:4] == b"\x7fELF"
        args = [np.load(tmp_path / "g" / a) for a in cand["args"]]
        expected = np.load(tmp_path / "g" / cand["expected"])
        # the physical arrays are the template's layouts of one set of logical inputs
        program = template.generate(cand["factors"])
        assert [a.shape for a in args] == [tuple(lay.shape) for lay in
                                           (program.layouts[n] for n in program.arg_names)]
        raw = program.random_inputs(0)
        np.testing.assert_allclose(expected, program.layouts["out"].apply(
            program.reference(raw)), rtol=1e-6)
