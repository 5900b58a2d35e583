"""Issues 15 and 40: console output a person can read. `make run > log.txt` (stdout not a terminal) prints one
line per labelled phase, when it ends, and the tables, under 200 lines (the first table within 40); on a terminal each phase is one bar with
`epoch N/total`, and no validation bars."""

import io
import os
import subprocess
import sys

import lightning as L
import torch
from torch import nn

from conftest import REPO
from ttp_lightning.fit.progress import PhaseBar, StageLine


def test_make_run_redirected_to_a_file_is_under_200_readable_lines(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env.update(WANDB_MODE="offline", TTP_CACHE_DIR=str(tmp_path / "cache"))  # an empty cache: pretraining too
    with (tmp_path / "log.txt").open("w") as log:
        proc = subprocess.run([sys.executable, "-m", "ttp_lightning", f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO,
                              env=env, stdout=log, stderr=subprocess.STDOUT, timeout=600, check=False)
    text = (tmp_path / "log.txt").read_text()
    assert proc.returncode == 0, text[-3000:]
    lines = text.splitlines()
    assert len(lines) < 200, len(lines)
    # one line per phase, when it ends; no per-epoch lines; the first table within the first 40 lines
    assert "pretraining A(D): 40 epochs in" in text and "Alg 1 finetuning: " in text and ": epoch " not in text
    first_table = next(i for i, line in enumerate(lines) if line.startswith("-----"))
    assert first_table <= 40, lines[:first_table]
    for noise in ("Validation DataLoader", "Tip:", "GPU available", "LeafSpec", "`Trainer.fit` stopped", "\r",
                  "anonymous setting"):
        assert noise not in text, noise
    assert "digits_mlp / pareto" in text and "attacks on the forget set" in text
    # within 100 columns (issue 63), but for the path of results.json, which is the user's own
    wide = [line for line in lines if len(line) > 100 and not line.startswith("results: ")]
    assert wide == [], wide
    # the samples of the README and of Getting started are what a fresh clone prints, digit for digit (issue 81;
    # wall-clock seconds aside)
    for page in ("README.md", "docs/getting-started.md"):
        missing = [line for line in sample_of(page) if not any(same_row(line, printed) for printed in lines)]
        assert missing == [], (page, missing)


def sample_of(page: str) -> list[str]:
    """The lines of a page's sample of `make run` (its '...' elisions left out)."""
    text = (REPO / page).read_text(encoding="utf-8")
    block = text.split("What a fresh clone prints", 1)[1].split("```", 2)[1]
    sample = [line for line in block.splitlines() if line.strip() and line.strip() != "..."]
    assert any(line.startswith("pareto ") for line in sample) and len(sample) > 10, sample
    return sample


def same_row(sample: str, printed: str) -> bool:
    """`printed` is the sample's line; a stage row's last column (wall s) may differ."""
    if sample.rstrip() == printed.rstrip():
        return True
    words, said = sample.split(), printed.split()
    timed = len(words) == 10 and words[0] in ("pretrain", "pareto") and words[-1].replace(".", "").isdigit()
    return timed and said[:-1] == words[:-1] and len(said) == len(words)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, _):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, _, dataloader_idx=0):
        self.log("val/x", self.layer(batch[0]).sum())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_on_a_terminal_each_phase_is_one_bar_without_validation_bars(monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buffer)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.rand(32, 2)), batch_size=8)
    trainer = L.Trainer(max_epochs=3, callbacks=[PhaseBar("Alg 1 finetuning", 1)], logger=False,
                        enable_checkpointing=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(Tiny(), loader, [loader, loader])
    shown = buffer.getvalue().replace("\r", "\n")
    assert "Alg 1 finetuning: epoch 3/3, <1 s left" in shown and "Epoch " not in shown  # the time left
    assert "Validation" not in shown and "Sanity" not in shown


class StopAfter(L.Callback):
    def __init__(self, epochs: int):
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module):
        trainer.should_stop = trainer.current_epoch + 1 >= self.epochs


def _fit(callbacks, epochs: int = 5):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.rand(32, 2)), batch_size=8)
    trainer = L.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, accelerator="cpu")
    trainer.fit(Tiny(), loader, [loader])


def test_a_bar_stopped_early_says_where_it_ended_with_short_names(monkeypatch):
    """Issue 63: the bar ends at the epoch the phase ended at (not `epoch 3/5, ~N s left`), its postfix short."""
    buffer = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buffer)
    _fit([PhaseBar("Alg 1 finetuning", 1), StopAfter(2)])
    final = buffer.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith("Alg 1 finetuning: 2 epochs in ") and "(stopped at epoch 2 of 5)" in final, final
    assert "val/" not in buffer.getvalue() and "train/" not in buffer.getvalue()


def test_in_a_pipe_a_long_phase_prints_a_line_at_least_every_interval():
    """Issue 63: through a pipe or a cluster log a phase says how far it is while it runs (every 60 s by default;
    here every epoch), and once at its end."""
    stream = io.StringIO()
    _fit([StageLine("Alg 1 finetuning", stream=stream, every=0.0), StopAfter(3)])
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines[:3]] == [f"Alg 1 finetuning: epoch {n}/5" for n in (1, 2, 3)]
    assert lines[-1].startswith("Alg 1 finetuning: 3 epochs in ") and len(lines) == 4
    quiet = io.StringIO()
    _fit([StageLine("Alg 1 finetuning", stream=quiet), StopAfter(3)])  # a short phase: its end line only
    assert len(quiet.getvalue().splitlines()) == 1


def test_the_resume_warning_of_the_projects_own_checkpoint_folders_is_silenced():
    """Lightning warns "Checkpoint directory ... exists and is not empty" on every resume, which the project does on
    purpose (fit/checkpointing.py); its other warnings still show."""
    import warnings

    from lightning.pytorch.utilities.rank_zero import rank_zero_warn

    from ttp_lightning.fit.progress import quiet_lightning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_lightning()
        rank_zero_warn("Checkpoint directory /tmp/x/checkpoints exists and is not empty.")
        rank_zero_warn("something else")
    assert [str(w.message) for w in caught] == ["something else"]


def test_a_long_loop_logs_its_progress_at_most_once_an_interval(caplog):
    """Issue 63: the relearning attack ran 35 minutes without a line; Paced logs one at least every interval."""
    import logging

    from ttp_lightning.core.console import Paced

    clock = iter([0.0, 30.0, 61.0, 90.0, 125.0, 200.0])
    paced = Paced("relearning attack (pareto)", "runs", every=60.0, clock=lambda: next(clock))
    with caplog.at_level(logging.INFO):
        for done in range(1, 6):
            paced.step(done, 6)
    lines = [r.getMessage() for r in caplog.records]
    # the time left at the pace since the last line: 61 s for 2 runs, then 64 s for 2, then 75 s for 1
    assert lines == ["relearning attack (pareto): 2 of 6 runs, 61 s, ~122 s left",
                     "relearning attack (pareto): 4 of 6 runs, 125 s, ~64 s left",
                     "relearning attack (pareto): 5 of 6 runs, 200 s, ~75 s left"]


def test_tables_fold_to_the_width_given_and_never_break_a_value():
    from ttp_lightning.core.console import table

    rows = [["stage", "retain acc", "test acc", "forget acc", "forget CD", "robust CD", "test CD", "forget l2", "NN CD",
             "wall s"], ["pretrain_original", "100.00%", "98.14%", "100.00%", "0.9000", "-", "0.8846", "0.9487",
                         "0.8999", "116.4"]]
    narrowest = sum(max(len(value), *(len(word) for word in title.split())) for title, value in zip(*rows)) + 2 * 9
    for width in (100, 80):  # 80 is narrower than the values allow: folded as far as it goes, no value broken
        lines = table(rows, width).splitlines()
        assert max(len(line) for line in lines) <= max(width, narrowest), (width, lines)
        assert lines[-1].split() == rows[1]  # every value whole, in its column
    assert max(len(line) for line in table(rows, 80).splitlines()) == narrowest == 90
    assert table(rows, 100).splitlines()[1].split()[:3] == ["stage", "acc", "test"]  # folded only as needed


def test_a_loop_whose_steps_outlast_the_interval_still_logs_a_heartbeat(caplog):
    """One APGD run can take minutes: inside `with Paced(...)` a line comes at least once an interval even when
    no step ends in it, and none after the loop."""
    import logging
    import time

    from ttp_lightning.core.console import Paced

    with caplog.at_level(logging.INFO):
        with Paced("attack table (pareto)", "attack runs", every=0.05) as paced:
            paced.step(1, 3)
            time.sleep(0.4)
        count = len(caplog.records)
        time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == count >= 2
    assert all(line.startswith("attack table (pareto): 1 of 3 attack runs, ") for line in lines)


def test_a_heartbeat_resets_the_interval_but_not_the_pace():
    """A heartbeat line (a step still running) must not make the next estimate of the time left read only the
    seconds since the heartbeat: the pace is from the last progress line."""
    from ttp_lightning.core.console import Pace

    clock = iter([0.0, 61.0, 130.0, 140.0, 200.0])
    pace = Pace(every=60.0, clock=lambda: next(clock))
    assert pace.due(2, 6) == (61.0, 122.0)  # 30.5 s a step, 4 left
    assert pace.beat() == 130.0
    assert pace.due(3, 6) is None  # 10 s after the heartbeat
    assert pace.due(4, 6) == (200.0, 139.0)  # (200 - 61) / 2 a step since the last progress line, 2 left


def test_long_help_lines_fold_under_their_first_value_and_never_break_a_word():
    from ttp_lightning.core.console import fold_long_lines

    names = ", ".join(f"option_{i}" for i in range(30))
    folded = fold_long_lines(f"short\ngroup: {names}\n  prose " + "word " * 40 + "\n", width=60)
    lines = folded.splitlines()
    assert lines[0] == "short" and folded.endswith("\n") and max(map(len, lines)) <= 60
    group = [line for line in lines if "option_" in line]
    assert group[0].startswith("group: option_0,") and all(line.startswith(" " * 7 + "o") for line in group[1:])
    assert " ".join(line.strip() for line in group) == f"group: {names}"  # every word whole, in order
    assert all(line.startswith("      word") for line in lines[len(group) + 2:])  # its own indent + 4
    assert fold_long_lines("x" * 80, width=60) == "x" * 80  # a word longer than the width stays whole
