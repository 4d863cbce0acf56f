"""Crop, resize, flip and normalise a batch of decode-cache canvases on the device.

One ``torchvision.ops.roi_align`` call crops every sample's box out of its canvas and
resizes it to ``size`` x ``size`` (bilinear; ``sampling_ratio=-1`` averages
ceil(box / size) samples per output pixel and axis, so downscaling is antialiased the way a
box filter is). The flip is a ``torch.where`` over the batch. Per sample the result depends
only on its own canvas and box, so it is the same in any batch, on any rank.
"""

from __future__ import annotations

import functools

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def crop_batch(canvases: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """``canvases`` uint8 ``[B, R, R, 3]`` and ``boxes`` float ``[B, 5]`` (x0, y0, x1, y1
    on the canvas, flip) on one device -> ImageNet-normalised float32 ``[B, 3, size, size]``."""
    from torchvision.ops import roi_align

    images = canvases.permute(0, 3, 1, 2).float()
    batch = torch.arange(len(boxes), device=boxes.device, dtype=boxes.dtype)[:, None]
    rois = torch.cat([batch, boxes[:, :4]], dim=1)
    out = roi_align(images, rois, output_size=(size, size), spatial_scale=1.0,
                    sampling_ratio=-1, aligned=True)
    flip = boxes[:, 4].bool()[:, None, None, None]
    out = torch.where(flip, out.flip(-1), out)
    mean, std = _normalisation(out.device)
    return (out - mean) / std


@functools.cache
def _normalisation(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std on the 0-255 scale, copied to ``device`` once (a copy per batch would
    be a host-to-device transfer on every step)."""
    return tuple(torch.tensor(v, device=device).view(1, 3, 1, 1) * 255
                 for v in (IMAGENET_MEAN, IMAGENET_STD))
