"""Registration of the XSum workload (no torch or transformers import here: listing must
stay fast)."""

from ddl.contract.hookspecs import hookimpl
from ddl.contract.specs import Preset, WorkloadSpec
from ddl_xsum.data import T5_SHAPES  # plain dicts: the shapes the models are built with


def _heads(model: str) -> int:
    """Attention heads per layer, for `ddl submit`'s tensor-parallel check without torch."""
    return T5_SHAPES[model]["num_heads"]


_COURSE = {"max_source_length": 512, "max_target_length": 150, "source_prefix": "summarize: ",
           "loss_reduction": "tokens", "lr_gamma": 0.3, "rouge": True}

PRESETS = {
    "course": Preset(
        name="course", attention_heads=_heads("t5-base"),
        parameters=222_903_552,  # the Hub checkpoint's (google-t5)
        summary="the JSC course: pretrained t5-base, inputs 512 / summaries 150 tokens, "
                "10 epochs, batch 4, AdamW 0.002, StepLR gamma 0.3",
        epochs=10, batch_size=4, lr=2e-3, options={"model": "t5-base", **_COURSE},
    ),
    "t5-small": Preset(
        name="t5-small", attention_heads=_heads("t5-small"),
        parameters=60_506_624,  # the Hub checkpoint's (google-t5)
        summary="the course's setup with pretrained t5-small (60M parameters)",
        epochs=10, batch_size=4, lr=2e-3, options={"model": "t5-small", **_COURSE},
    ),
    # bigger models for layouts that shard them (FSDP, tensor and pipeline parallel):
    # pretrained when `ddl prepare --plugin xsum --preset NAME` fetched them, else random
    "t5-large": Preset(
        name="t5-large", attention_heads=_heads("t5-large"),
        parameters=737_668_096,  # the Hub checkpoint's (google-t5)
        summary="the course's setup with t5-large (738M parameters); pretrained if "
                "`ddl prepare --preset t5-large` fetched it, else random",
        epochs=10, batch_size=4, lr=2e-3,
        options={"model": "t5-large", "tokenizer": "t5-base", **_COURSE}),
    "t5-3b": Preset(
        name="t5-3b", attention_heads=_heads("t5-3b"),
        parameters=2_851_598_336,  # the Hub checkpoint's (google-t5)
        summary="the course's setup with t5-3b (2.9B parameters); pretrained if "
                "`ddl prepare --preset t5-3b` fetched it, else random",
        epochs=10, batch_size=4, lr=2e-3,
        options={"model": "t5-3b", "tokenizer": "t5-base", **_COURSE}),
    # the GPU check kit trains it at the largest batch that fits ~80 % of the GPU
    # (--batch-size from its batch search); no ROUGE: generating summaries is no training
    "throughput": Preset(
        name="throughput", attention_heads=_heads("t5-base"),
        parameters=222_903_552,  # the Hub checkpoint's (google-t5)
        summary="to fill a GPU: the course's t5-base, lengths and AdamW lr, batch 64, no ROUGE",
        epochs=10, batch_size=64, lr=2e-3,
        options={"model": "t5-base", **_COURSE, "rouge": False},
    ),
    "tiny": Preset(
        name="tiny", attention_heads=_heads("t5-tiny"),
        summary="for CPU tests: a 2+2-layer T5 (d_model 64) from scratch, 128/32 tokens, "
                "3 epochs, batch 16, AdamW 0.005, StepLR gamma 0.7",
        epochs=3, batch_size=16, lr=5e-3,
        options={"model": "t5-tiny", "tokenizer": "t5-base", "max_source_length": 128,
                 "max_target_length": 32, "source_prefix": "", "loss_reduction": "samples",
                 "lr_gamma": 0.7, "rouge": True, "rouge_samples": 16,
                 "train_samples": 1024, "eval_samples": 128},
    ),
}


@hookimpl
def ddl_register_workloads():
    return [
        WorkloadSpec(
            name="xsum",
            summary="XSum news summarisation with T5 (JSC course; Hugging Face transformers)",
            factory="ddl_xsum.workload:XsumWorkload",
            presets=PRESETS,
            default_preset="course",
            contract="2",  # the contract major it is built against
            # pipeline stages are xsum's own: T5 is no plain chain (ddl_xsum.pipeline)
            capabilities=frozenset({"fsdp_units", "tp_plan", "pipeline_splits"}),
        ),
    ]
