"""Vision transformers from timm, built without pretrained weights for the data set's image size."""

import timm
from torch import nn


def vision_transformer(in_channels: int, image_size: int, num_classes: int, variant: str = "vit_small_patch16_224",
                       patch_size: int = 4, pretrained: bool = False, **kwargs) -> nn.Module:
    """timm ViT with `img_size`/`patch_size` set so small images give a sensible token count
    (32 px with patch 4 -> 64 tokens). The head is one affine layer."""
    return timm.create_model(variant, pretrained=pretrained, num_classes=num_classes, img_size=image_size,
                             patch_size=patch_size, in_chans=in_channels, **kwargs)
