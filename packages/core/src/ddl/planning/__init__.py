"""The planning room: everything ``ddl plan`` and ``--mesh auto`` need to choose a layout,
without training (``ddl plan --verify`` then trains the best few: commands.plan_verify).

- ``plan_target``: what the plan is for (a site's nodes and devices, or this machine).
- ``layout_search``: every candidate layout (degrees, micro-batch, checkpointing,
  pipeline schedule) for that many devices.
- ``plan_probe``: what a workload's model holds and computes, found on the meta device
  (parameters per rank, activations per micro-batch, FLOPs per pipeline stage);
  ``autocast_probe``: its activations under bf16/fp16 autocast, on fake tensors.
- ``memory_model``: bytes per rank (model state, activations in flight) from those
  shapes; ``memory_fit``: the check ``ddl submit`` and ``ddl train`` make with it before
  the queue.
- ``step_time_model``: seconds per step (compute at a device's rate, the collectives'
  alpha-beta cost, FSDP's overlap, the pipeline bubble, recomputation).
- ``cpu_calibration``: a CPU plan's own measurements of this machine (gloo links, matmul
  rate, the workload's passes, optimizer and data); ``wrapper_calibration``: the host
  work DDP, FSDP2 and tensor parallel add to a step, timed in a one-rank process group.
- ``planner``: the predictions for every candidate, ranked.

The CLI command (commands.plan) is a thin caller; ``ddl doctor --collectives`` measures
the alpha-beta numbers (commands.collective_probe). Sits above the worker (it probes
models as a rank builds them) and below launch (whose submit checks use memory_fit).
"""
