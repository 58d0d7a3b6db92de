"""The zoo's entries: small seeded configs of public `transformers` architectures (random weights, no download).

Sizes are cut down (fewer and narrower layers, small images, short sequences) so each model captures, exports
and verifies in seconds on two CPU cores; the operators are those of the full architectures.
"""
from typing import Any, Dict

from edgedyn.zoo.records import InputSpec, ZooModel

FAMILIES = ("cnn", "encoder", "segmentation", "detector", "decoder", "audio")
VOCAB = 1000


def _image(size: int) -> tuple:
    return (InputSpec("pixel_values", (1, 3, size, size)),)


def _tokens(length: int) -> tuple:
    return (InputSpec("input_ids", (1, length), "int64", high=VOCAB),)


def _resnet() -> Any:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                                     depths=[1, 1, 1, 1], layer_type="basic", num_labels=10))


def _mobilenet_v2() -> Any:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    return MobileNetV2ForImageClassification(MobileNetV2Config(depth_multiplier=0.35, image_size=96, num_labels=10))


def _convnext() -> Any:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    return ConvNextForImageClassification(ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                         num_labels=10))


def _efficientnet() -> Any:
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    return EfficientNetForImageClassification(EfficientNetConfig(image_size=64, width_coefficient=0.25,
                                                                 depth_coefficient=0.25, hidden_dim=320,
                                                                 num_labels=10))


def _poolformer() -> Any:
    from transformers import PoolFormerConfig, PoolFormerForImageClassification

    return PoolFormerForImageClassification(PoolFormerConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                             num_labels=10))


def _mobilevit() -> Any:
    from transformers import MobileViTConfig, MobileViTForImageClassification

    return MobileViTForImageClassification(MobileViTConfig(
        image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
        num_attention_heads=2, num_labels=10))


def _vit() -> Any:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, intermediate_size=128, num_labels=10))


def _deit() -> Any:
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    return DeiTForImageClassificationWithTeacher(DeiTConfig(image_size=32, patch_size=8, hidden_size=64,
                                                            num_hidden_layers=2, num_attention_heads=2,
                                                            intermediate_size=128, num_labels=10))


def _swin() -> Any:
    from transformers import SwinConfig, SwinForImageClassification

    return SwinForImageClassification(SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1],
                                                 num_heads=[1, 2], window_size=4, num_labels=10))


def _segformer() -> Any:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    return SegformerForSemanticSegmentation(SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5))


def _yolos() -> Any:
    from transformers import YolosConfig, YolosForObjectDetection

    return YolosForObjectDetection(YolosConfig(image_size=[64, 64], patch_size=16, hidden_size=64,
                                               num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                               num_detection_tokens=10, num_labels=5))


def _distilbert() -> Any:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    return DistilBertForSequenceClassification(DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=2,
                                                                hidden_dim=128, max_position_embeddings=64,
                                                                num_labels=3))


def _roberta() -> Any:
    from transformers import RobertaConfig, RobertaModel

    return RobertaModel(RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=128, max_position_embeddings=64), add_pooling_layer=False)


def _gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    # use_cache=False: logits at one fixed length; a KV cache is state a fixed-shape capture does not carry.
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
                                      eos_token_id=0,
                                      use_cache=False))


def _whisper_encoder() -> Any:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    # The encoder wants exactly 2 * max_source_positions frames (3000 for the real 30 s window).
    return WhisperEncoder(WhisperConfig(num_mel_bins=80, d_model=64, encoder_layers=2, encoder_attention_heads=2,
                                        encoder_ffn_dim=128, max_source_positions=50))


def _wav2vec2() -> Any:
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    return Wav2Vec2ForCTC(Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 4, 4),
                                         conv_kernel=(10, 8, 8), num_conv_pos_embeddings=16,
                                         num_conv_pos_embedding_groups=4))


def _wav2vec2_lv60() -> Any:
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    # As wav2vec2-large-lv60 and XLS-R are built: layer norm in every feature-encoder conv and before each encoder
    # layer (do_stable_layer_norm). These take an attention_mask; the group-norm base model above does not.
    return Wav2Vec2ForCTC(Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 4, 4),
                                         conv_kernel=(10, 8, 8), num_conv_pos_embeddings=16,
                                         num_conv_pos_embedding_groups=4, feat_extract_norm="layer",
                                         do_stable_layer_norm=True))


_ENTRIES = (
    ZooModel("resnet", "cnn", "ResNetForImageClassification", _resnet, _image(64), ("logits",),
             "ResNet-18-style basic blocks, 4 stages", fast=True),
    ZooModel("mobilenet_v2", "cnn", "MobileNetV2ForImageClassification", _mobilenet_v2, _image(96), ("logits",),
             "MobileNetV2 at depth multiplier 0.35 (depthwise convs, ReLU6)"),
    ZooModel("convnext", "cnn", "ConvNextForImageClassification", _convnext, _image(64), ("logits",),
             "ConvNeXt: 7x7 depthwise convs, channel layer norm, GELU, layer scale"),
    ZooModel("efficientnet", "cnn", "EfficientNetForImageClassification", _efficientnet, _image(64), ("logits",),
             "EfficientNet: MBConv with squeeze-excitation, SiLU, 'same' padding"),
    ZooModel("poolformer", "cnn", "PoolFormerForImageClassification", _poolformer, _image(64), ("logits",),
             "PoolFormer: average pooling as the token mixer, group norm"),
    ZooModel("mobilevit", "cnn", "MobileViTForImageClassification", _mobilevit, _image(64), ("logits",),
             "MobileViT: MobileNet blocks with unfold/fold transformer blocks"),
    ZooModel("vit", "encoder", "ViTForImageClassification", _vit, _image(32), ("logits",),
             "ViT: patch embedding, 2 transformer layers, class token", fast=True),
    ZooModel("deit", "encoder", "DeiTForImageClassificationWithTeacher", _deit, _image(32),
             ("logits", "cls_logits", "distillation_logits"), "DeiT with its distillation token and two heads"),
    ZooModel("swin", "encoder", "SwinForImageClassification", _swin, _image(64), ("logits",),
             "Swin: shifted-window attention, patch merging"),
    ZooModel("segformer", "segmentation", "SegformerForSemanticSegmentation", _segformer, _image(64), ("logits",),
             "SegFormer: efficient self-attention, mix-FFN, an all-MLP decoder (logits at 1/4 resolution)"),
    ZooModel("yolos", "detector", "YolosForObjectDetection", _yolos, _image(64),
             ("logits", "pred_boxes", "last_hidden_state"), "YOLOS: ViT with detection tokens; class logits and normalized boxes", fast=True),
    ZooModel("distilbert", "encoder", "DistilBertForSequenceClassification", _distilbert, _tokens(16), ("logits",),
             "DistilBERT sequence classifier on 16 token ids"),
    ZooModel("roberta", "encoder", "RobertaModel", _roberta, _tokens(16), ("last_hidden_state",),
             "RoBERTa encoder (no pooler) on 16 token ids"),
    ZooModel("gpt2", "decoder", "GPT2LMHeadModel", _gpt2, _tokens(16), ("logits",),
             "GPT-2 causal LM logits at a fixed length of 16, no KV cache"),
    ZooModel("whisper_encoder", "audio", "WhisperEncoder", _whisper_encoder,
             (InputSpec("input_features", (1, 80, 100)),), ("last_hidden_state",),
             "Whisper's encoder on 100 log-mel frames (1 s at this size)"),
    ZooModel("wav2vec2", "audio", "Wav2Vec2ForCTC", _wav2vec2, (InputSpec("input_values", (1, 1600)),), ("logits",),
             "Wav2Vec2 CTC head on 0.1 s of raw 16 kHz audio: conv feature encoder, grouped conv positions"),
    ZooModel("wav2vec2_lv60", "audio", "Wav2Vec2ForCTC", _wav2vec2_lv60, (InputSpec("input_values", (1, 1600)),),
             ("logits",), "Wav2Vec2 as wav2vec2-large-lv60 and XLS-R: layer-norm feature encoder, pre-norm layers; "
                          "takes an attention_mask"),
)
MODELS = {entry.name: entry for entry in _ENTRIES}  # type: Dict[str, ZooModel]
