"""A data set in memory: its official partitions as uint8 NCHW tensors with integer labels."""

from dataclasses import dataclass

import torch


@dataclass
class ImageArrays:
    """The official train and test partitions as uint8 [N, C, H, W] images and int64 labels."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    class_names: tuple[str, ...] = ()  # from the data set's own files (CIFAR's meta, TinyImageNet's folders)
    train_files: tuple[str, ...] = ()  # each image's file under the data root, where it has one (image folders)
    test_files: tuple[str, ...] = ()
    # a validation partition of the user's own (an image folder's val/), never trained on: robust Alg 1's retain
    # rule reads its accuracy there (alg1/method.retain_parts); None where the data set has none
    val_images: torch.Tensor | None = None
    val_labels: torch.Tensor | None = None
