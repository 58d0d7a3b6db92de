"""The zoo's encoders with three buckets and padding, on every backend: 20 calls at random lengths between and at the
buckets match torch eager on the unpadded input within the fp32 tolerance; the models padding would change are
refused with the numbers and what would fix them.
"""
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

from conftest import require_module

RTOL = 1e-4
BACKENDS = ("portable", "onnxruntime", "tflite")
# model -> (--input options, --pad): token models with their attention mask, wav2vec2 on samples with its mask.
ENCODERS = {
    "distilbert": (["input_ids=1x{8,16,32}:int64", "attention_mask=1x{8,16,32}:int64"], "input_ids=0,attention_mask=0"),
    "roberta": (["input_ids=1x{8,16,32}:int64", "attention_mask=1x{8,16,32}:int64"], "input_ids=1,attention_mask=0"),
    "wav2vec2_lv60": (["input_values=1x{800,1600,3200}", "attention_mask=1x{800,1600,3200}:int64"],
                      "input_values=0,attention_mask=0"),
}
# The default run keeps DistilBERT on every backend and wav2vec2 on the portable one; the rest are `zoo_full`.
DEFAULT = {("distilbert", backend) for backend in BACKENDS} | {("wav2vec2_lv60", "portable")}
CASES = [pytest.param(name, backend, id="{}-{}".format(name, backend),
                      marks=() if (name, backend) in DEFAULT else pytest.mark.zoo_full)
         for name in ENCODERS for backend in BACKENDS]
_MODELS = {}  # type: Dict[str, object]


def _model(name: str):
    require_module("transformers")
    from edgedyn import zoo

    if name not in _MODELS:
        _MODELS[name] = zoo.build(name)
    return _MODELS[name]


def _lengths(sizes: List[int], shortest: int, rng: np.random.Generator) -> List[int]:
    """The buckets themselves and random lengths between: 20 calls."""
    return list(sizes) + [int(n) for n in rng.integers(shortest, sizes[-1], 20 - len(sizes))]


def _call(name: str, length: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    if name == "wav2vec2_lv60":
        return {"input_values": rng.standard_normal((1, length)).astype(np.float32),
                "attention_mask": np.ones((1, length), np.int64)}
    return {"input_ids": rng.integers(2, 1000, (1, length)).astype(np.int64),
            "attention_mask": np.ones((1, length), np.int64)}


@pytest.mark.parametrize("name, backend", CASES)
def test_zoo_encoder_buckets_match_torch_on_unpadded_calls(name, backend, tmp_path: Path):
    import torch

    import edgedyn
    import edgedyn.runtime as rt

    require_module({"onnxruntime": "onnxruntime", "tflite": "ai_edge_litert"}.get(backend, "numpy"))
    model = _model(name)
    inputs, pad = ENCODERS[name]
    path = edgedyn.export(model, inputs=inputs, pad=pad, backend=backend, output=tmp_path / "m.edgedyn")
    program = rt.load(path)
    (group,) = program.manifest["buckets"]
    padding = group["padding"]
    if name == "wav2vec2_lv60":  # frames follow samples through three strided convs: one rule, (L - 105) // 80
        assert padding["outputs"] == [{"name": "logits",
                                       "axes": [{"axis": 1, "scale": 1, "offset": -105, "divisor": 80}]}]
        assert padding["min_length"] == 265  # shorter calls give no frame its positional conv can use
    rng = np.random.default_rng(29)
    for length in _lengths(group["sizes"], padding["min_length"], rng):
        feeds = _call(name, length, rng)
        with torch.no_grad():
            want = model(**{key: torch.from_numpy(value) for key, value in feeds.items()})
        got = program(**feeds)
        for key in want.keys():
            expected, actual = want[key].numpy(), got[key]
            assert actual.shape == expected.shape, (length, key)
            error = float(np.max(np.abs(actual - expected)))
            assert error <= 1e-6 + RTOL * float(np.max(np.abs(expected))), (length, key, error)


@pytest.mark.parametrize("name, inputs, pad, message, hint", [
    ("distilbert", ["input_ids=1x{8,16,32}:int64"], "input_ids=0",
     "padding is not exact for DistilBertForSequenceClassification: output 'logits' changes when 'input_ids' dim 1 "
     "is padded from", "pass the model its attention_mask as an input, bucketed and padded with 0 (--input "
                       "'attention_mask=1x{8,16,32}:int64' --pad input_ids=0,attention_mask=0)"),
    ("wav2vec2", ["input_values=1x{800,1600,3200}", "attention_mask=1x{800,1600,3200}:int64"],
     "input_values=0,attention_mask=0",
     "padding is not exact for Wav2Vec2ForCTC: output 'logits' changes when 'input_values' dim 1, 'attention_mask' "
     "dim 1 are padded from", "a norm over the padded dimension (such as GroupNorm over time) counts the padding"),
])
def test_zoo_models_padding_would_change_are_refused_with_numbers(name, inputs, pad, message, hint, tmp_path):
    import edgedyn
    from edgedyn.frontend.padding import PaddingRefused

    culprit = {"distilbert": "distilbert.transformer.layer.0.attention (DistilBertSelfAttention)",
               "wav2vec2": "wav2vec2.feature_extractor.conv_layers.0.layer_norm (GroupNorm)"}[name]
    with pytest.raises(PaddingRefused) as raised:
        edgedyn.export(_model(name), inputs=inputs, pad=pad, backend="portable", output=tmp_path / "r.edgedyn")
    assert raised.value.message.startswith(message), raised.value.message
    assert raised.value.message.endswith("while its input's does not: " + culprit)
    assert "max abs error" in raised.value.message and hint in raised.value.hint


def test_whisper_encoder_takes_one_length_only(tmp_path: Path):
    """Whisper's encoder checks its frame count against its position table, so no length but its own captures:
    a known limit, said in the model's own words."""
    import edgedyn
    from edgedyn.errors import CaptureError

    with pytest.raises(CaptureError, match="WhisperEncoder raised ValueError.* on the example inputs "
                                           "input_features=1x80x50: Whisper expects the mel input features to be of "
                                           "length 100, but found 50"):
        edgedyn.export(_model("whisper_encoder"), inputs=["input_features=1x80x{50,100}"], pad="input_features=0",
                       backend="portable", output=tmp_path / "w.edgedyn")
