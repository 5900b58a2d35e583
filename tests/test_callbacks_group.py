"""The `callbacks` config group: Alg 1's early stopping, history and timer are built by Hydra from it, and
any other entry is a Lightning callback that every fit of the run gets."""

from lightning.pytorch.callbacks import Callback

from conftest import finished

FITS: list[str] = []


class RecordFits(Callback):
    """Records the stage of every fit it is attached to (by the class name of the module)."""

    def on_fit_start(self, trainer, pl_module) -> None:
        FITS.append(type(pl_module).__name__)


def test_an_added_callback_reaches_every_fit_and_the_method_callbacks_come_from_the_group(run_main):
    FITS.clear()
    code, _, err, results = run_main("+callbacks.recorder._target_=test_callbacks_group.RecordFits")
    finished(code, results, err)
    assert FITS == ["ERMModule", "ParetoFinetuneModule"]  # pretraining and Alg 1
    assert len(results["history"]["pareto"]) == results["metrics"]["pareto"]["epochs_run"] > 0
    assert results["metrics"]["pareto"]["train_steps"] > 0

def test_alg1_without_its_callbacks_is_refused_before_any_work(run_main):
    FITS.clear()
    code, _, err, results = run_main("~callbacks.history",
                                     "+callbacks.recorder._target_=test_callbacks_group.RecordFits")
    expected = ("error: callbacks.history is missing; Alg 1 needs callbacks.best_model, .history and .timer "
                "(conf/callbacks/default.yaml)")
    assert code == 2 and err.strip().splitlines() == [expected]
    assert results is None and FITS == []
