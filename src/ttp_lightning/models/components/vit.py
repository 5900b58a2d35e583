"""Vision transformers from timm for the data set's image size, from scratch or finetuned from pretrained
weights (`model.pretrained_file=PATH`, or `model.pretrained=true` from the hub), as the paper does."""

from torch import nn

from ttp_lightning.models.components.timm_model import timm_model


def vision_transformer(in_channels: int, image_size: int, num_classes: int, variant: str = "vit_small_patch16_224",
                       patch_size: int = 4, pretrained: bool = False, pretrained_file: str | None = None,
                       **kwargs) -> nn.Module:
    """timm ViT with `img_size`/`patch_size` set so small images give a sensible token count (32 px with
    patch 4 -> 64 tokens). Pretrained weights of another patch or image size are adapted by timm (patch
    embedding and position embedding resampled); the head is a new affine layer for `num_classes`."""
    return timm_model(in_channels, image_size, num_classes, name=variant, pretrained=pretrained,
                      pretrained_file=pretrained_file, patch_size=patch_size, **kwargs)
