"""The paper-bound certified step under `trainer=ddp_sim` (two gloo processes): each rank runs half of the curvature
work, and the noise-free weights and the certificate's measured constants are those of one process; so
are the final metrics, which the two ranks evaluate on their own shares."""

import json

import pytest
import torch

from conftest import TINY_WITHOUT_METHOD, finished, release_of
from test_certified_cli import LOGREG, PAPER
from ttp_lightning.assess.evaluation import evaluate
from ttp_lightning.certified.certificate.document import load_weights, noise_free_key
from ttp_lightning.certified.common import KINDS, request_parts
from ttp_lightning.certified.maths.newton import (
    NewtonPath,
    curvature,
    newton_step,
    step_dtype,
    step_generator,
)
from ttp_lightning.verify.audit import method_config, rebuild_model

CASES = {
    "alg2_digits_logreg": LOGREG + PAPER + ["method=certified_exact", "method.warmup_epochs=0"],
    "alg3_digits_mlp": PAPER + ["pretrain.norm_bound=10", "method.lam=auto", "method.grad_lipschitz_forget=20",
                        "method.grad_lipschitz_retain=20", "attacks.enabled=false", "method=certified_lissa",
                        "method.warmup_epochs=0", "method.depth=auto", "method.repeats=4", "method.sample_size=16",
                        "method.max_residual=10"],
}
COMPARED = ("gradient_norm", "step_norm", "hessian_norm_measured", "lam_min_measured", "norm_before_projection")


def relative(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_give_the_single_process_newton_step_with_half_the_work_each(run_cli, tmp_path, case):
    proc, results = run_cli(*TINY_WITHOUT_METHOD, "trainer=ddp_sim", *CASES[case], tiny=False)
    finished(proc.returncode, results, proc.stderr)
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    out = tmp_path / "out"
    cert = json.loads((release_of(out) / "certificate.json").read_text())
    audit = json.loads((out / "private" / "audit.json").read_text())
    metrics = results["metrics"][results["method"]]
    assert metrics["ranks"] == 2

    # the same step in this one process, from the start weights the run recorded
    datamodule, net = rebuild_model(cert, out / "private" / audit["start_file"], [])
    kind = KINDS[cert["algorithm"]]
    settings = method_config(cert)
    (retain, forget), = request_parts(datamodule, cert["algorithm"])
    curv = curvature(net, settings, retain, forget, dtype=step_dtype(kind))
    path = NewtonPath()
    newton_step(curv, settings, kind, step_generator(settings, kind), cert["norm_bound_config"], cert["projection"],
                path)

    released_free = load_weights(out / "private" / audit["noise_free_file"])[noise_free_key(0)]
    assert relative(released_free, path.noise_free[0]) < 1e-6
    for key in COMPARED:
        assert relative(cert["steps"][0][key], path.steps[0][key]) < 1e-6, key
    if kind == "estimated":
        assert relative(cert["steps"][0]["residual"], path.steps[0]["residual"]) < 1e-6
    # the final metrics, evaluated by two ranks on their shares, are one process's on the released weights
    released = release_of(out) / cert["weights"][-1]["file"]
    datamodule, released_net = rebuild_model(cert, released, [])
    single = evaluate(released_net, datamodule)
    assert set(single) <= set(metrics)  # the same values up to the last rounded digit (another summation order)
    assert all(abs(single[key] - metrics[key]) <= 1.5e-6 for key in single), (single, metrics)
    share = metrics["curvature_images_per_rank"] / curv.instances
    print(f"{case}: noise-free weights differ by {relative(released_free, path.noise_free[0]):.2e} (relative l2); "
          f"rank 0 ran {metrics['curvature_images_per_rank']} of {curv.instances} curvature images")
    assert 0.45 <= share <= 0.55, (metrics["curvature_images_per_rank"], curv.instances)


@pytest.mark.slow  # two processes; the single-process residual release is verified in the default suite
def test_the_residual_certificate_under_two_ranks_verifies_on_one_process(run_cli, tmp_path, capsys):
    """bound=residual under ddp_sim: every rank solves the same head problem (not sharded); the release that
    rank 0 writes is audited in this one process, which remeasures the residual at its noise-free weights."""
    from test_certified_cli import RELEASES
    from ttp_lightning import verify

    proc, results = run_cli(*TINY_WITHOUT_METHOD, "trainer=ddp_sim", *RELEASES["certified_exact"], tiny=False)
    finished(proc.returncode, results, proc.stderr)
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    out = tmp_path / "out"
    cert = json.loads((release_of(out) / "certificate.json").read_text())
    assert cert["bound"] == "residual" and cert["steps"][0]["stationarity"] < 1e-9
    assert results["metrics"][results["method"]]["ranks"] == 2
    code = verify.main([str(release_of(out)), "--audit", str(out / "private" / "audit.json"),
                        *([] if results["release_gate"]["passed"] else ["--allow-unprotected"])])
    assert code == 0, capsys.readouterr().out
