"""Receptive-field windows for CROWN's backward passes through convolutional layers (issue 62, item 1).

A ReLU's pre-activation bound at one position of a convolutional layer depends on the values before it only
within that position's receptive field. A backward pass that starts from one tile of positions at a layer
therefore carries coefficients that are zero outside a window of each earlier layer: the tile, grown at every
convolution by its kernel and stride. `Window` holds only that rectangle ([S, N, C, h, w] and where it sits in the
layer's [H, W]), so that the passes for the intermediate bounds of a 28 x 28 layer cost what its receptive fields
cost, not what the whole image does (Xu et al. 2020's patches mode computes the same coefficients, per position).

The rules here are the exact transposes of the layers that keep a window a window: a 2-d convolution (zero
padding, any stride, dilation and groups; its transpose is conv_transpose2d without padding, cropped to the
layer's input, where the positions outside it are the padding's zeros, constants that no bound depends on), a
BatchNorm2d in eval mode with running statistics (a scale and shift per channel), a residual addition (the union
of the two windows) and the identity. Any other layer turns the window into the dense coefficients
(`Window.dense`) and the pass goes on as linear.LinearBounds' own, so a window is only ever an exact, cheaper
representation of the same numbers.

`Patches` runs the passes of many neurons at different positions as one (Xu et al. 2020's patches mode): one
rectangle per specification, not cropped at the layer's edge (its coefficients there are set to zero, as the
padding's, and the values it reads there are 0). A pass costs a fixed 1-2 ms on a CPU, so where each position has
a few unstable neurons (a network's first, largest layers) it is several times faster than a pass a position;
where each has many, one shared, cropped window a position costs less (linear.PATCHES_BELOW chooses per layer).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class Rectangles:
    """What Window and Patches share: coefficients `weights` [S, N, C, h, w] on rectangles of a layer that
    `take` reads values from, and `like` rebuilds with other weights at the same places."""
    weights: torch.Tensor

    def take(self, value: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def like(self, weights: torch.Tensor) -> "Rectangles":
        raise NotImplementedError

    def abs(self) -> "Rectangles":
        return self.like(self.weights.abs())

    def no_constant(self) -> torch.Tensor:
        """[S, N] zeros: the constant a layer without a bias term adds."""
        return self.weights.new_zeros(self.weights.shape[:2])

    def dot(self, value: torch.Tensor) -> torch.Tensor:
        """[S, N]: sum of the coefficients times their rectangles of `value` ([N, C, H, W] or broadcast)."""
        return (self.weights * self.take(value)).sum(dim=(2, 3, 4))


@dataclass(frozen=True)
class Window(Rectangles):
    """Coefficients [S, N, C, h, w] that are zero outside rows top..top+h and columns left..left+w of a value of
    shape [N, C, H, W] (the window lies inside it)."""
    weights: torch.Tensor
    top: int
    left: int

    def take(self, value: torch.Tensor) -> torch.Tensor:
        """The window's rectangle of a tensor whose last two dimensions are the layer's [H, W]."""
        height, width = self.weights.shape[-2:]
        return value[..., self.top:self.top + height, self.left:self.left + width]

    def like(self, weights: torch.Tensor) -> "Window":
        return Window(weights, self.top, self.left)

    def dense(self, size: tuple[int, int]) -> torch.Tensor:
        """The same coefficients over the whole [H, W] = size."""
        height, width = self.weights.shape[-2:]
        return F.pad(self.weights, (self.left, size[1] - self.left - width, self.top, size[0] - self.top - height))


@dataclass(frozen=True)
class Patches(Rectangles):
    """Coefficients [S, N, C, h, w] of a value of shape [N, C, H, W], each specification s's zero outside rows
    top[s]..top[s]+h and columns left[s]..left[s]+w: one rectangle per specification, so that the passes of
    neurons at many positions of a layer run as one (Xu et al. 2020's patches mode). A rectangle may reach past
    the value's edge, where its coefficients are zero (the layers' zero padding) and the values read are 0."""
    weights: torch.Tensor
    top: torch.Tensor  # [S], long
    left: torch.Tensor

    def _index(self, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int, int]]:
        """(rows [S, h], columns [S, w]) in a copy of a [H, W] = size value padded by (top, bottom, left, right)."""
        height, width = self.weights.shape[-2:]
        pads = (max(0, -int(self.top.min())), max(0, int(self.top.max()) + height - size[0]),
                max(0, -int(self.left.min())), max(0, int(self.left.max()) + width - size[1]))
        rows = (self.top + pads[0])[:, None] + torch.arange(height, device=self.top.device)
        columns = (self.left + pads[2])[:, None] + torch.arange(width, device=self.left.device)
        return rows, columns, pads

    def take(self, value: torch.Tensor) -> torch.Tensor:
        """[S, N, C, h, w]: each specification's rectangle of `value` ([N, C, H, W]), 0 past its edge."""
        rows, columns, (top, bottom, left, right) = self._index(tuple(value.shape[-2:]))
        padded = F.pad(value, (left, right, top, bottom))
        taken = padded[:, :, rows[:, :, None], columns[:, None, :]]  # [N, C, S, h, w]
        return taken.permute(2, 0, 1, 3, 4)

    def like(self, weights: torch.Tensor) -> "Patches":
        return Patches(weights, self.top, self.left)

    def dense(self, size: tuple[int, int]) -> torch.Tensor:
        """The same coefficients over the whole [H, W] = size: [S, N, C, H, W]."""
        rows, columns, (top, bottom, left, right) = self._index(size)
        specs, images, channels = self.weights.shape[:3]
        canvas = self.weights.new_zeros(specs, size[0] + top + bottom, size[1] + left + right, images, channels)
        index = torch.arange(specs, device=rows.device)[:, None, None]
        canvas[index, rows[:, :, None], columns[:, None, :]] = self.weights.permute(0, 3, 4, 1, 2)
        canvas = canvas[:, top:top + size[0], left:left + size[1]]
        return canvas.permute(0, 3, 4, 1, 2).contiguous()


WINDOWED = (Window, Patches)


def merge(first: Window | Patches, second: Window | Patches) -> Window | Patches | None:
    """first + second over the union of their rectangles (None for two Patches whose rectangles do not sit at
    one offset from each other in every specification: the caller adds them densely)."""
    if isinstance(first, Patches) or isinstance(second, Patches):
        return _merge_patches(first, second) if isinstance(first, Patches) and isinstance(second, Patches) else None
    return _merge_windows(first, second)


def _merge_patches(first: Patches, second: Patches) -> Patches | None:
    rise, shift = first.top - second.top, first.left - second.left
    if len(rise) == 0 or not (bool((rise == rise[0]).all()) and bool((shift == shift[0]).all())):
        return None
    rise, shift = int(rise[0]), int(shift[0])  # first's rectangle sits (rise, shift) from second's in every spec
    (first_height, first_width), (second_height, second_width) = first.weights.shape[-2:], second.weights.shape[-2:]
    top, left = min(rise, 0), min(shift, 0)  # the union's corner, relative to second's
    bottom, right = max(rise + first_height, second_height), max(shift + first_width, second_width)

    def grown(weights: torch.Tensor, row: int, column: int) -> torch.Tensor:
        height, width = weights.shape[-2:]
        return F.pad(weights, (column - left, right - column - width, row - top, bottom - row - height))

    return Patches(grown(first.weights, rise, shift) + grown(second.weights, 0, 0), second.top + top,
                   second.left + left)


def _merge_windows(first: Window, second: Window) -> Window:
    """first + second over the union of their rectangles."""
    top, left = min(first.top, second.top), min(first.left, second.left)
    bottom = max(first.top + first.weights.shape[-2], second.top + second.weights.shape[-2])
    right = max(first.left + first.weights.shape[-1], second.left + second.weights.shape[-1])

    def grown(window: Window) -> torch.Tensor:
        height, width = window.weights.shape[-2:]
        return F.pad(window.weights, (window.left - left, right - window.left - width,
                                      window.top - top, bottom - window.top - height))

    return Window(grown(first) + grown(second), top, left)


def module_rule(module: nn.Module):
    """The function (module, window of its output, its input's [H, W]) -> (the constant gained, the window of its
    input) that is this module's exact transpose on a window, or None where there is none."""
    if isinstance(module, nn.Conv2d) and module.padding_mode == "zeros" and not isinstance(module.padding, str):
        return through_convolution
    if isinstance(module, nn.BatchNorm2d) and not module.training and module.running_mean is not None:
        return through_batchnorm  # affine in its input: eval mode, running statistics
    if isinstance(module, nn.Identity) or (isinstance(module, nn.Dropout) and not module.training):
        return through_identity
    return None


def through_identity(module: nn.Module, window: Window | Patches, size: tuple[int, int]
                     ) -> tuple[torch.Tensor, Window | Patches]:
    return window.no_constant(), window


def through_convolution(conv: nn.Conv2d, window: Window | Patches, size: tuple[int, int]
                        ) -> tuple[torch.Tensor, Window | Patches | torch.Tensor]:
    """(the constant gained, the window of the convolution's input of spatial `size`) for coefficients `window`
    of its output. Patches stay Patches, their coefficients past the input's edge set to zero (the padding's),
    until their rectangle is as tall or as wide as the input: then dense [S, N, C, H, W], no larger."""
    specs, images, channels, height, width = window.weights.shape
    flat = window.weights.reshape(specs * images, channels, height, width)
    grown = F.conv_transpose2d(flat, conv.weight.to(flat.dtype), stride=conv.stride, dilation=conv.dilation,
                               groups=conv.groups)
    top, left = window.top * conv.stride[0] - conv.padding[0], window.left * conv.stride[1] - conv.padding[1]
    constant = window.no_constant() if conv.bias is None else window.weights.sum(dim=(3, 4)) @ conv.bias.to(flat.dtype)
    if isinstance(window, Patches):
        grown = grown.reshape(specs, images, *grown.shape[1:])
        rows = top[:, None] + torch.arange(grown.shape[-2], device=top.device)
        columns = left[:, None] + torch.arange(grown.shape[-1], device=left.device)
        inside = ((rows >= 0) & (rows < size[0]))[:, :, None] & ((columns >= 0) & (columns < size[1]))[:, None, :]
        passed = Patches(grown * inside[:, None, None].to(grown.dtype), top, left)
        if grown.shape[-2] >= size[0] or grown.shape[-1] >= size[1]:
            return constant, passed.dense(size)
        return constant, passed
    first_row, first_column = max(0, -top), max(0, -left)
    last_row, last_column = min(grown.shape[-2], size[0] - top), min(grown.shape[-1], size[1] - left)
    grown = grown[..., first_row:last_row, first_column:last_column]
    passed = Window(grown.reshape(specs, images, *grown.shape[1:]), top + first_row, left + first_column)
    return constant, passed


def through_batchnorm(norm: nn.BatchNorm2d, window: Window | Patches, size: tuple[int, int] | None = None
                      ) -> tuple[torch.Tensor, Window | Patches]:
    """(the constant gained, the window of the normalisation's input): y = scale x + shift per channel."""
    dtype = window.weights.dtype
    scale = torch.rsqrt(norm.running_var.to(dtype) + norm.eps)
    if norm.weight is not None:
        scale = scale * norm.weight.to(dtype)
    shift = -norm.running_mean.to(dtype) * scale
    if norm.bias is not None:
        shift = shift + norm.bias.to(dtype)
    passed = window.weights * scale[:, None, None]
    return window.weights.sum(dim=(3, 4)) @ shift, window.like(passed)
