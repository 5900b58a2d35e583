"""How many images one forward pass should hold (`python scripts/bench_passes.py`): the seconds per 1,000 images
of an evaluation pass (eval mode, no gradient) and of an attack step's pass (forward and input gradient, as APGD's
Probe takes it) at several pass sizes, for the MNIST ResNet8 (width 16, BatchNorm) and the MNIST MLP, random
weights and images (speed does not depend on them).

Why it exists: APGD's probe takes its rows ROWS_PER_PASS (128, the training batch's size) at a time
(attacks/apgd.py): on a CPU a large pass can be slower once a layer's activations outgrow the caches, and this
prints what each size costs. Timings in a fresh process vary from run to run with the memory allocator's state:
time the real thing too (a judge's attack, an epoch) before changing a size. Results go to --out (JSON, default
bench/passes.json). Run it alone on the machine (`OMP_NUM_THREADS` is the torch thread count).
"""

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
from torch import nn

from ttp_lightning.attacks.apgd import ROWS_PER_PASS
from ttp_lightning.models.components.resnet import ResNet


def networks() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {"mnist_resnet8_w16": ResNet(in_channels=1, image_size=28, num_classes=10, blocks=[1, 1, 1, 0],
                                        block="basic", width=16),
            "mnist_mlp": nn.Sequential(nn.Flatten(), nn.Linear(784, 100), nn.ReLU(), nn.Linear(100, 10))}


def seconds_per_1k(net: nn.Module, images: torch.Tensor, size: int, gradient: bool, repeats: int) -> float:
    """The best of `repeats` timings of every image through `net` in passes of `size`, per 1,000 images."""
    def once():
        for start in range(0, len(images), size):
            x = images[start:start + size]
            if gradient:
                x = x.clone().requires_grad_(True)
                torch.autograd.grad(net(x).logsumexp(-1).sum(), x)
            else:
                with torch.inference_mode():
                    net(x)

    once()  # warm-up: the first pass of a shape pays for its kernels' set-up
    timings = []
    for _ in range(repeats):
        begin = time.perf_counter()
        once()
        timings.append(time.perf_counter() - begin)
    return min(timings) / len(images) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024, 1600, 4096])
    parser.add_argument("--images", type=int, default=4096, help="images per timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/passes.json"))
    args = parser.parse_args(argv)
    images = torch.rand(args.images, 1, 28, 28)
    rows = []
    for name, net in networks().items():
        net.eval()
        for parameter in net.parameters():
            parameter.requires_grad_(False)
        for size in args.sizes:
            for gradient in (False, True):
                row = {"network": name, "pass": "attack step" if gradient else "evaluation", "size": size,
                       "s_per_1k": round(seconds_per_1k(net, images, size, gradient, args.repeats), 4)}
                rows.append(row)
                print(f"{name:18s} {row['pass']:12s} {size:5d} a pass: {row['s_per_1k']:.3f} s / 1,000 images",
                      flush=True)
    report = {"rows_per_pass": ROWS_PER_PASS, "threads": torch.get_num_threads(), "cpu": platform.processor(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
