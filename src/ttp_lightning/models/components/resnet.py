"""ResNets with a small-image stem (3x3 stride-1 conv, no max-pool) for 8/28/32/64 px inputs."""

from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, 1, 1, bias=False), nn.BatchNorm2d(planes),
        )
        self.shortcut = _shortcut(in_planes, planes, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        out = planes * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(in_planes, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out),
        )
        self.shortcut = _shortcut(in_planes, out, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


def _shortcut(in_planes: int, out_planes: int, stride: int) -> nn.Module:
    if stride == 1 and in_planes == out_planes:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(in_planes, out_planes, 1, stride, bias=False), nn.BatchNorm2d(out_planes))


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nn.Module):
    """Stages of `blocks` (e.g. [2,2,2,2] for ResNet18; a 0 drops that stage, so [1,1,1,0] is ResNet8),
    widths 64/128/256/512, then global average pooling and one affine layer."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, blocks: list[int],
                 block: str = "basic", width: int = 64):
        super().__init__()
        block_cls = BLOCKS[block]
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True))
        stages, in_planes = [], width
        for stage, count in enumerate(blocks):
            planes = width * 2**stage
            for i in range(count):
                stages.append(block_cls(in_planes, planes, stride=2 if stage > 0 and i == 0 else 1))
                in_planes = planes * block_cls.expansion
        self.stages = nn.Sequential(*stages)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.stages(self.stem(x))))
