"""Two real gloo processes: DDP-sharded gradients and metrics equal the single-process values."""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from test_modules import OPTIM, tiny_net, tiny_sets
from ttp_lightning.alg1.module import ParetoFinetuneModule
from ttp_lightning.core.batching import batch_loader
from ttp_lightning.core.metrics import ConfidenceDistance


def _gradient_and_metric(module: ParetoFinetuneModule, retain) -> tuple[list[torch.Tensor], torch.Tensor]:
    grads, _ = module._mean_gradient(retain, module._retain_loss)
    metric = ConfidenceDistance()
    with torch.no_grad():
        for images, labels in batch_loader(retain, 4, training=False):  # this rank's uneven shard
            metric.update(module.net(images), labels)
    return grads, metric.compute()


def _worker(rank: int, port: int, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    retain, forget = tiny_sets(n_retain=37)
    module = ParetoFinetuneModule(tiny_net(), 0.5, OPTIM, mode="fullbatch", chunk_size=5,
                                  retain_data=retain, forget_data=forget)
    grads, conf_dist = _gradient_and_metric(module, retain)
    if rank == 0:
        torch.save({"grads": grads, "conf_dist": conf_dist}, out_path)
    dist.barrier()
    dist.destroy_process_group()


def test_two_process_gradient_and_metric_match_single_process(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(port, str(out)), nprocs=2, join=True)
    distributed = torch.load(out)

    retain, forget = tiny_sets(n_retain=37)
    module = ParetoFinetuneModule(tiny_net(), 0.5, OPTIM, mode="fullbatch", chunk_size=5,
                                  retain_data=retain, forget_data=forget)
    grads, conf_dist = _gradient_and_metric(module, retain)
    for a, b in zip(distributed["grads"], grads):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.isclose(distributed["conf_dist"], conf_dist, atol=1e-6)
