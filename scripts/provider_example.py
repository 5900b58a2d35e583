"""A model provider's side of the worked example (docs/protect.md), without ttp_lightning: a data set as an image
folder, a classifier trained on it with plain torch (or Lightning), and the images someone asked to be
protected.

    python scripts/provider_example.py --out example

writes
    example/digits/train/<class>/*.png, example/digits/test/<class>/*.png   scikit-learn's 8x8 digits, 70/30
    example/model.pt            the trained network's state_dict (--format safetensors: model.safetensors;
                                --format ckpt: a Lightning checkpoint, model.ckpt)
    example/forget/<class>/*.png  5 images to protect: 3 from the training folder, 2 from the test folder

The network is nn.Sequential(Flatten, Linear(64, 128), ReLU, Linear(128, 10)) on [0, 1] pixels, which is
ttp_lightning's `model=mlp model.hidden_dim=128` with `data.normalize=false`.

    python scripts/provider_example.py --out example_cnn --model resnet10t

writes the same digits as 32 x 32 colour images (bilinear upsampling, grey copied to three channels) and a
timm resnet10t (BatchNorm, residual blocks) trained on them with plain torch: ttp_lightning's `model=timm
model.name=resnet10t`.
"""

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn

FORGET_FROM_TRAIN, FORGET_FROM_TEST = 3, 2


CNN_SIZE = 32


def network(model: str = "mlp", hidden: int = 128) -> nn.Module:
    if model == "resnet10t":
        import timm

        return timm.create_model("resnet10t", num_classes=10, in_chans=3)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def to_colour(images: np.ndarray) -> np.ndarray:
    """8 x 8 grey digits as CNN_SIZE x CNN_SIZE RGB images (bilinear upsampling)."""
    return np.stack([np.asarray(Image.fromarray(image, mode="L").resize((CNN_SIZE, CNN_SIZE), Image.BILINEAR)
                                .convert("RGB")) for image in images])


def write_folder(root: Path, images: np.ndarray, labels: np.ndarray, names: np.ndarray) -> None:
    for image, label, name in zip(images, labels, names):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L" if image.ndim == 2 else "RGB").save(folder / f"{name:04d}.png")


def train_plain(x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int, model: str = "mlp") -> nn.Module:
    torch.manual_seed(seed)
    net = network(model)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2 if model == "mlp" else 1e-3)
    for _ in range(epochs):
        for batch in torch.randperm(len(y)).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
            optimizer.step()
    return net.eval()


def train_lightning(x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int, path: Path) -> nn.Module:
    import lightning as L

    class Digits(L.LightningModule):
        def __init__(self, lr: float = 1e-2):
            super().__init__()
            self.save_hyperparameters()
            self.net = network()

        def training_step(self, batch, _):
            images, labels = batch
            return nn.functional.cross_entropy(self.net(images), labels)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    L.seed_everything(seed, verbose=False)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
    module = Digits()
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader)
    trainer.save_checkpoint(path)
    return module.net.eval()


def as_input(images: np.ndarray) -> torch.Tensor:
    """uint8 [N, H, W] (grey) or [N, H, W, 3] (colour) as float [N, C, H, W] pixels in [0, 1]."""
    x = torch.as_tensor(images, dtype=torch.float32) / 255.0
    return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("example"))
    parser.add_argument("--format", choices=("pt", "safetensors", "ckpt"), default="pt")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=("mlp", "resnet10t"), default="mlp",
                        help="resnet10t: 32 x 32 colour images and a timm resnet10t (trained for --epochs 15)")
    args = parser.parse_args()
    if args.model == "resnet10t" and args.format == "ckpt":
        parser.error("--format ckpt is for the MLP")
    torch.set_num_threads(1 if args.model == "mlp" else max(1, torch.get_num_threads()))

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    if args.model == "resnet10t":
        images = to_colour(images)
    order = np.random.default_rng(args.seed).permutation(len(images))
    cut = round(0.7 * len(images))
    train, test = order[:cut], order[cut:]
    write_folder(args.out / "digits" / "train", images[train], digits.target[train], train)
    write_folder(args.out / "digits" / "test", images[test], digits.target[test], test)
    forget = np.concatenate([train[:FORGET_FROM_TRAIN], test[:FORGET_FROM_TEST]])
    write_folder(args.out / "forget", images[forget], digits.target[forget], forget)

    x, y = as_input(images[train]), torch.as_tensor(digits.target[train])
    if args.format == "ckpt":
        path = args.out / "model.ckpt"
        net = train_lightning(x, y, args.epochs, args.seed, path)
    else:
        net = train_plain(x, y, args.epochs if args.model == "mlp" else min(args.epochs, 15), args.seed, args.model)
        path = args.out / f"model.{args.format}"
        if args.format == "safetensors":
            from safetensors.torch import save_file

            save_file(net.state_dict(), str(path))
        else:
            torch.save(net.state_dict(), path)
    with torch.no_grad():
        accuracy = (net(as_input(images[test])).argmax(1).numpy() == digits.target[test]).mean()
    print(f"wrote {args.out}/digits (train {len(train)}, test {len(test)} images), {path} "
          f"(test accuracy {accuracy:.2%}) and {len(forget)} images to protect in {args.out}/forget")


if __name__ == "__main__":
    main()
