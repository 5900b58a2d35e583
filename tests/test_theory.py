"""The theory-helper command: the paper's bounds on the command line, JSON output, one-line errors."""

import json
import math

import pytest

from ttp_lightning.dp.mechanism import classical_sigma
from ttp_lightning.theory import main


def run(capsys, *args):
    code = main(list(args))
    return code, capsys.readouterr()


def test_theta_bound_guarantees_the_target_uniformity(capsys):
    code, out = run(capsys, "--json", "theta-bound", "--epsilon", "50", "--retain-size", "1000", "--classes", "10")
    theta = json.loads(out.out)["theta_lower_bound"]
    assert code == 0 and 0 < theta < 1
    code, out = run(capsys, "--json", "uniformity-bound", "--theta", str(theta), "--retain-size", "1000",
                    "--classes", "10")
    assert code == 0 and json.loads(out.out)["uniformity_bound"] == pytest.approx(50)
    code, out = run(capsys, "uniformity-bound", "--theta", "0.5", "--retain-size", "8", "--classes", "4")
    assert code == 0 and out.out.startswith(f"uniformity_bound = {math.sqrt(2 * 8 * math.log(4)):.6g}")


def test_noise_uses_the_classical_calibration_below_epsilon_one(capsys):
    code, out = run(capsys, "--json", "noise", "--sensitivity", "3", "--epsilon", "0.5", "--delta", "1e-5")
    result = json.loads(out.out)
    assert result["mechanism"] == "classical" and result["sigma"] == pytest.approx(classical_sigma(3, 0.5, 1e-5))
    code, out = run(capsys, "--json", "noise", "--sensitivity", "3", "--epsilon", "2", "--delta", "1e-5")
    assert code == 0 and json.loads(out.out)["mechanism"] == "analytic_gaussian"
    single = json.loads(out.out)["sigma"]
    code, out = run(capsys, "--json", "noise", "--sensitivity", "3", "--epsilon", "2", "--delta", "1e-5",
                    "--releases", "4")
    assert code == 0 and json.loads(out.out)["sigma"] == pytest.approx(2 * single)  # sqrt(4) Delta


@pytest.mark.parametrize("args, message", [
    (["noise", "--sensitivity", "1", "--epsilon", "1", "--delta", "2"], "--delta: 2.0 is not allowed"),
    (["uniformity-bound", "--theta", "1", "--retain-size", "5", "--classes", "3"], "--theta: 1.0 is not allowed"),
    (["theta-bound", "--epsilon", "1", "--retain-size", "5", "--classes", "1"], "at least 2 classes"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
