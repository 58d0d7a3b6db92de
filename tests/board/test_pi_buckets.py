"""Buckets on the emulated Raspberry Pi 4: DistilBERT with three buckets and padding, exported for the Pi with each
CPU backend, called on the board at lengths between and at the buckets, and compared with torch eager on the
unpadded input here; `verify` on the board runs the proven padded calls again. Small on purpose (one encoder, three
buckets, four lengths): qemu makes every call slow."""
import json
from pathlib import Path

import numpy as np
import pytest

from .emulator import run_edgedyn

pytestmark = pytest.mark.requires("transformers", "onnxruntime", "ai_edge_litert")

BOARD = "raspberry-pi-4"
BACKENDS = ("portable", "onnxruntime", "tflite")
INPUTS = ["input_ids=1x{8,16,32}:int64", "attention_mask=1x{8,16,32}:int64"]
LENGTHS = (3, 16, 21, 32)  # padded into the first and third buckets, and two buckets' own sizes

# Runs on the board: every bundle at every length, outputs to an .npz per bundle; then each bundle's verify.
BOARD_SCRIPT = """
import json, sys
import numpy as np
import edgedyn.runtime as rt
jobs = json.load(open(sys.argv[1]))
report = {}
for job in jobs:
    program = rt.load(job["bundle"], threads=2)
    with np.load(job["inputs"]) as data:
        calls = {k: data[k] for k in data.files}
    outputs = {}
    for length in job["lengths"]:
        ids, mask = calls["ids.{}".format(length)], calls["mask.{}".format(length)]
        outputs["logits.{}".format(length)] = program(input_ids=ids, attention_mask=mask)["logits"]
        outputs["bucket.{}".format(length)] = np.array(program.dispatch(input_ids=ids, attention_mask=mask)[0].name)
    np.savez(job["out"], **outputs)
    results = program.verify()
    report[job["backend"]] = {"verified": [r["specialization"] for r in results if r["ok"]],
                              "failed": [r["specialization"] for r in results if not r["ok"]],
                              "artifact": program.specializations[0].artifact["backend"]}
print(json.dumps(report))
"""


def test_distilbert_buckets_pad_and_match_torch_on_the_emulated_pi(pi_rootfs: Path, tmp_path: Path) -> None:
    import torch

    import edgedyn
    from edgedyn import zoo
    from edgedyn.boards import load_board

    model = zoo.build("distilbert")
    rng = np.random.default_rng(4)
    calls = {}
    for length in LENGTHS:
        calls["ids.{}".format(length)] = rng.integers(2, 1000, (1, length)).astype(np.int64)
        calls["mask.{}".format(length)] = np.ones((1, length), np.int64)
    np.savez(tmp_path / "calls.npz", **calls)
    jobs = []
    for backend in BACKENDS:
        bundle = edgedyn.export(model, inputs=INPUTS, pad="input_ids=0,attention_mask=0", board=BOARD,
                                backend=backend, output=tmp_path / "distilbert-{}.edgedyn".format(backend))
        jobs.append({"backend": backend, "bundle": str(bundle), "inputs": str(tmp_path / "calls.npz"),
                     "lengths": list(LENGTHS), "out": str(tmp_path / "out-{}.npz".format(backend))})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    result = run_edgedyn(pi_rootfs, ["-c", BOARD_SCRIPT, str(tmp_path / "jobs.json")], cpu=load_board(BOARD).qemu_cpu)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for job in jobs:
        ran = report[job["backend"]]
        assert ran["artifact"] == job["backend"] and not ran["failed"], ran
        assert sum("padded from" in name for name in ran["verified"]) >= 3, ran  # a proven padded call per bucket
        with np.load(job["out"]) as data:
            for length in LENGTHS:
                with torch.no_grad():
                    want = model(input_ids=torch.from_numpy(calls["ids.{}".format(length)]),
                                 attention_mask=torch.from_numpy(calls["mask.{}".format(length)]))["logits"].numpy()
                got = data["logits.{}".format(length)]
                bucket = min(size for size in (8, 16, 32) if size >= length)
                assert str(data["bucket.{}".format(length)]).startswith("input_ids=1x{}:int64".format(bucket))
                assert float(np.max(np.abs(got - want))) <= 1e-6 + 1e-4 * float(np.max(np.abs(want))), (
                    job["backend"], length)
