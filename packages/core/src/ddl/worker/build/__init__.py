"""The build room: how a rank gets its model, before the first step.

- ``model_build``: build the workload's model whole on the CPU, or (a layout that splits
  it) on the meta device, and load pretrained weights; a build that cannot replay exactly
  is built whole with one note.
- ``deferred_init``: record a meta-device build and draw any one tensor's initial values
  later, bit for bit what one process draws; ``meta_redirects``: what runs in place of the
  torch functions that would make that inexact (initialisers that skip meta tensors,
  reseeding).
- ``materialize``: give a rank's part of a meta model its memory and values (from the
  recording, or the pretrained file), one tensor at a time.
- ``weights_file``: pretrained weights in safetensors, read tensor by tensor.
- ``build_memory``: how much memory the build itself cost this rank (results.json).
- The block options applied to the built model before the strategy wraps it:
  ``activation_checkpointing`` (``--activation-checkpointing``), ``compiling``
  (``--compile``, per block), ``sync_bn`` (``--sync-bn``: BatchNorm over the global batch).
"""
