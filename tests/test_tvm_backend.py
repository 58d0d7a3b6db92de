"""Every example through the TVM backend: equal to torch eager on fresh random inputs, deterministic bundles."""
import numpy as np
import pytest
import torch

import edgedyn
import edgedyn.runtime as rt
from edgedyn.frontend.loading import load_reference

from conftest import EXAMPLE_MODELS, EXAMPLES, RTOL, assert_matches_torch

pytestmark = pytest.mark.requires("tvm")


@pytest.mark.parametrize("example", sorted(EXAMPLE_MODELS))
def test_example_matches_torch_on_fresh_inputs(export_example, example):
    assert_matches_torch(rt.load(export_example(example)), example)


@pytest.mark.parametrize("example", sorted(EXAMPLE_MODELS))
def test_example_verifies_with_its_reference_data(export_example, example):
    results = rt.load(export_example(example)).verify()
    assert results and all(r["ok"] for r in results), results
    assert all(r["max_rel"] < RTOL for r in results)


def test_loop_example_bundle_records_the_unrolled_graph(export_example):
    manifest = rt.read_manifest(export_example("loop_example"))
    (spec,) = manifest["specializations"]
    assert spec["graph"]["ops_captured"] == 4
    assert {"kind": "constant", "input": "n", "type": "int", "expected": 4, "source": "--input n=4"} in spec["guards"]


def test_batchnorm_is_folded_in_the_exported_cnn(export_example):
    (spec,) = rt.read_manifest(export_example("tiny_cnn"))["specializations"]
    assert spec["graph"]["ops_optimized"] < spec["graph"]["ops_captured"]


def test_mlp_bundle_stores_its_weights_once_for_two_batch_sizes(export_example):
    manifest = rt.read_manifest(export_example("mlp"))
    weights = {s["artifacts"][0]["files"]["weights"] for s in manifest["specializations"]}
    assert len(manifest["specializations"]) == 2 and len(weights) == 1


def test_export_is_deterministic_apart_from_the_time(tmp_path):
    model, _, _ = load_reference(str(EXAMPLES / "tiny_cnn.py:TinyCNN"))
    manifests, members = [], []
    example = (torch.randn(1, 3, 32, 32),)
    for name in ("a", "b"):
        # backend tvm, not auto: the Pi prefers onnxruntime, and the cross-compiled .so is what must not vary.
        bundle = rt.Bundle(edgedyn.export(model, example, board="raspberry-pi-4", backend="tvm",
                                          output=tmp_path / (name + ".edgedyn")))
        manifest = dict(bundle.manifest)
        assert manifest.pop("created")
        manifests.append(manifest)
        members.append({member: bundle.read(member) for member in manifest["members"]})
    (spec,) = manifests[0]["specializations"]
    (artifact,) = spec["artifacts"]
    assert artifact["backend"] == "tvm" and artifact["arch"] == "aarch64"
    library = members[0][artifact["files"]["library"]]
    assert library[:4] == b"\x7fELF" and library == members[1][artifact["files"]["library"]]
    assert members[0] == members[1]
    assert manifests[0] == manifests[1]


def test_aarch64_bundle_holds_an_aarch64_library(export_example):
    bundle = rt.Bundle(export_example("tiny_cnn", board="raspberry-pi-4"))
    (spec,) = bundle.manifest["specializations"]
    artifact = spec["artifacts"][0]
    library = bundle.read(artifact["files"]["library"])
    assert library[:4] == b"\x7fELF" and int.from_bytes(library[18:20], "little") == 183  # EM_AARCH64
    assert artifact["arch"] == "aarch64" and artifact["tvm_target"]["mcpu"] == "cortex-a72"
    assert bundle.manifest["board"]["name"] == "raspberry-pi-4"


def test_weights_are_plain_arrays_not_pickles(export_example):
    bundle = rt.Bundle(export_example("tiny_cnn"))
    (spec,) = bundle.manifest["specializations"]
    weights = bundle.arrays(spec["artifacts"][0]["files"]["weights"])  # np.load(allow_pickle=False) inside
    assert weights and all(array.dtype == np.float32 for array in weights.values())
