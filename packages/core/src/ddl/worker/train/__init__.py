"""The train room: the training loop, from a run configuration to the trained weights.

- ``setup``: from the run configuration and plan to a model ready to train (plugins,
  layout, model, optimizer, loaders, precision); ``trainer``: the loop every workload
  and strategy shares, top to bottom; ``epoch``: one epoch's steps, then validation;
  ``step``: one optimizer step (zero_grad, the strategy's forward and backward,
  clipping, the optimizer, the lr schedule) - read this one first.
- ``loaders``: the datasets split over the data-parallel replicas; ``samples``: data
  errors that name the split and the sample.
- ``precision``: mixed precision (autocast, fp16's loss scaling); ``lr_schedule``: the
  learning rate per step; ``control``: stop decisions all ranks take together (a
  non-finite loss, a signal, a stop file).
- ``evaluation`` and ``metrics``: exact metrics however the split is sharded.
"""
