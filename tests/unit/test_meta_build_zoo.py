"""Models nobody here wrote, built the way ddl builds a layout that splits them: on the meta
device, then every tensor drawn through the Materializer a rank uses
(ddl.conformance.check_meta_build). Each must equal, bit for bit, the model the same
constructor gives in one process at the same seed, with the random generator where a plain
build leaves it, or be refused with a reason (a run then builds the plain way with a note).

torchvision's and Hugging Face transformers' own classes, at small configurations built
from their config objects (nothing downloaded): the init code is theirs whatever the size.
Before issue 49 the ViTs, ConvNeXt, Swin and DeiT came out different (trunc_normal_ did
nothing on the meta device); ResNet, GPT-2, BERT, Llama and T5 were already exact.
"""

from __future__ import annotations

import pytest

from ddl import conformance

pytestmark = pytest.mark.unit


def torchvision_resnet50():
    from torchvision.models.resnet import Bottleneck, ResNet

    return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10)  # resnet50's block, 1 per stage


def torchvision_vit_b_16():
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2,
                             hidden_dim=32, mlp_dim=64, num_classes=10)


def torchvision_convnext_tiny():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)


def torchvision_swin_t():
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                           window_size=[4, 4], num_classes=10)


def hf(model: str, config: str, **options):
    def build():
        import transformers

        return getattr(transformers, model)(getattr(transformers, config)(**options))
    return build


SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64)
ZOO = {
    "torchvision-resnet50": torchvision_resnet50,
    "torchvision-vit_b_16": torchvision_vit_b_16,
    "torchvision-convnext_tiny": torchvision_convnext_tiny,
    "torchvision-swin_t": torchvision_swin_t,
    "hf-gpt2": hf("GPT2LMHeadModel", "GPT2Config", n_embd=32, n_layer=2, n_head=2,
                  vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0),
    "hf-bert": hf("BertForMaskedLM", "BertConfig", vocab_size=100,
                  max_position_embeddings=32, **SMALL),
    "hf-llama": hf("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=1, vocab_size=100,
                   max_position_embeddings=32, **SMALL),
    "hf-t5": hf("T5ForConditionalGeneration", "T5Config", vocab_size=100, d_model=32, d_kv=8,
                d_ff=64, num_layers=2, num_heads=4),
    "hf-vit": hf("ViTForImageClassification", "ViTConfig", image_size=32, patch_size=8,
                 num_labels=10, **SMALL),
    "hf-deit": hf("DeiTForImageClassificationWithTeacher", "DeiTConfig", image_size=32,
                  patch_size=8, num_labels=10, **SMALL),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_third_party_models_build_on_meta_bit_for_bit(name):
    report = conformance.check_meta_build(ZOO[name], seed=3)
    assert report.fallback is None, report.summary()  # these all replay: none falls back
    assert report.ok and report.checked > 10, report.summary()
