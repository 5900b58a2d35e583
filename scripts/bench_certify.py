"""Benchmarks of the certified learners' building blocks; writes one JSON per device.

1. One Hessian-vector product (Pearlmutter, the same code Alg 3 samples with) as a multiple of one
   forward+backward of the same loss on the same batch: the MNIST MLP (784-100-10, batch 128) and
   ResNet18 (32 px, 3 channels, 10 classes, batch 32). Medians over repeated timings.
2. Peak memory of Alg 3's Newton direction (Lanczos for lambda_min and ||H||, the estimator chain, the
   full-data residual; the hypothesis checks are skipped, the network is random) on ResNet18 (11 M parameters): peak RSS (CPU) or peak allocated memory (CUDA) above what
   the model, its data and one forward+backward already hold, next to the model's own size and the size
   an explicit #params x #params Hessian would need. Activation memory grows with the images per pass
   (`--chunk-size`, the method's `chunk_size`; the sampled HVPs use the sample size).
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ttp_lightning.certified.maths.estimator import stochastic_inverse_hvp
from ttp_lightning.certified.maths.hvp import ParetoCurvature, flatten
from ttp_lightning.certified.maths.newton import measured_spectrum
from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.dataset_info import DatasetInfo
from ttp_lightning.core.objectives import UNIFORMITY_LOSSES, retain_loss
from ttp_lightning.models.components import build_classifier

MODELS = {
    "mlp": ({"_target_": "ttp_lightning.models.components.linear.MLP", "hidden_dim": 100}, (1, 28, 10), 128),
    "resnet18": ({"_target_": "ttp_lightning.models.components.resnet.ResNet", "blocks": [2, 2, 2, 2], "block": "basic",
                  "width": 64}, (3, 32, 10), 32),
}


def build(name: str, device: torch.device):
    model_cfg, (channels, size, classes), batch = MODELS[name]
    info = DatasetInfo(num_classes=classes, channels=channels, image_size=size, mean=(0.5,) * channels,
                       std=(0.25,) * channels)
    torch.manual_seed(0)
    return build_classifier(OmegaConf.create(model_cfg), info).to(device), info, batch


def synthetic(info, count: int, seed: int) -> ImageBatchDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, info.channels, info.image_size, info.image_size), dtype=torch.uint8,
                           generator=generator)
    return ImageBatchDataset(images, torch.randint(0, info.num_classes, (count,), generator=generator))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of fn() over `repeats` runs after two warm-up runs."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hvp_cost(name: str, device: torch.device, repeats: int) -> dict:
    net, info, batch = build(name, device)
    data = synthetic(info, batch, seed=1)
    curv = ParetoCurvature(net, data, data, 0.75, UNIFORMITY_LOSSES["kl"])
    images, labels = data[list(range(batch))]
    images, labels = images.to(device), labels.to(device)
    vector = torch.randn(sum(p.numel() for p in curv.params), device=device)

    def forward_backward():
        torch.autograd.grad(retain_loss(net(images), labels), curv.params)

    def hvp():
        curv._hvp_of(retain_loss(net(images), labels), vector)

    fwd_bwd, product = timed(forward_backward, device, repeats), timed(hvp, device, repeats)
    return {"params": len(vector), "batch": batch, "forward_backward_ms": round(1e3 * fwd_bwd, 3),
            "hvp_ms": round(1e3 * product, 3), "hvp_over_forward_backward": round(product / fwd_bwd, 2)}


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets VmHWM to the current RSS (Linux)


def estimator_memory(device: torch.device, retain_size: int, depth: int, chunk_size: int, lanczos: int) -> dict:
    net, info, batch = build("resnet18", device)
    retain, forget = synthetic(info, retain_size, seed=2), synthetic(info, 32, seed=3)
    cfg = OmegaConf.create({"lanczos_iterations": lanczos, "spectrum_margin": 0.1})
    curv = ParetoCurvature(net, retain, forget, 0.75, UNIFORMITY_LOSSES["kl"], lam=1.0, chunk_size=chunk_size)
    model_bytes = sum(t.numel() * t.element_size() for t in list(net.parameters()) + list(net.buffers()))
    curv.gradient()  # the data, the model and one full backward are the baseline
    if device.type == "cuda":
        synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()
        baseline = peak_rss_bytes()
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    spectrum = measured_spectrum(curv, cfg, generator)
    gradient = curv.gradient()
    direction = stochastic_inverse_hvp(gradient, lambda part, v, keep: curv.sample_hvp(part, v, batch, generator, keep),
                                       0.75,
                                       1.0, 1.2 * (spectrum.norm + 1.0), depth, 1, generator, slack=float("inf"))
    residual = ((curv.hvp(direction) - gradient).norm() / gradient.norm()).item()
    synchronize(device)
    wall = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()
    params = len(flatten(p.detach() for p in curv.params))
    return {
        "model": "resnet18", "params": params, "retain_size": retain_size, "depth": depth,
        "sample_size": batch, "chunk_size": chunk_size, "memory": "cuda_max_allocated" if device.type == "cuda" else "peak_rss",
        "model_mib": round(model_bytes / 2**20, 1), "baseline_mib": round(baseline / 2**20, 1),
        "peak_mib": round(peak / 2**20, 1), "peak_above_baseline_mib": round((peak - baseline) / 2**20, 1),
        "explicit_hessian_tib": round(params**2 * 4 / 2**40, 1),
        "lanczos_iterations": lanczos, "lanczos_basis_host_mib": round(lanczos * params * 4 / 2**20, 1),
        "wall_s": round(wall, 2), "residual": round(residual, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=10, help="timed HVPs and forward+backwards per model")
    parser.add_argument("--retain-size", type=int, default=256, help="synthetic retain images for the memory run")
    parser.add_argument("--depth", type=int, default=10, help="estimator steps in the memory run")
    parser.add_argument("--lanczos", type=int, default=3, help="Lanczos steps in the memory run")
    parser.add_argument("--chunk-size", type=int, default=32,
                        help="images per full-data HVP pass (method.chunk_size): sets the activation memory")
    parser.add_argument("--out", default=None, help="default bench/certify_<device>.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    report = {
        "machine": {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
                    or platform.machine(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "hvp_cost": {name: hvp_cost(name, device, args.repeats) for name in MODELS},
        "alg3_memory": estimator_memory(device, args.retain_size, args.depth, args.chunk_size, args.lanczos),
    }
    out = Path(args.out or f"bench/certify_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
