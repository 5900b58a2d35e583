"""The run's record: results.json's top level as one frozen dataclass, built once at the end of a run from the
parts each stage returned (the stages' metrics, the assessment, the weights, the release), and written as
JSON from it. Its fields' documentation is the reference table in docs/results-json.md
(`python scripts/results_schema.py`, checked by tests/test_docs.py)."""

from dataclasses import dataclass, field, fields, replace

from ttp_lightning.run.assessment import Assessment


def _doc(text: str, when: str = "always") -> dict:
    return {"doc": text, "when": when}


@dataclass(frozen=True)
class RunRecord:
    experiment: str = field(metadata=_doc("the experiment's name (`experiment_name`: `<data>_<model>` unless an "
                                          "experiment file names it)"))
    method: str = field(metadata=_doc("the method's name (`method.name`), the key of its stage in `metrics`"))
    config: dict = field(metadata=_doc("the resolved config the run composed (its record; the run read typed "
                                       "settings)"))
    data: dict = field(metadata=_doc("sizes, the forget set's indices, fingerprint and digest"))
    metrics: dict = field(metadata=_doc("per stage (`pretrain`, the method, `pretrain_original` when forget "
                                        "instances came from the test set): evaluation, the method's own numbers "
                                        "and the assessment's per-image summary"))
    history: dict = field(metadata=_doc("the method's per-epoch rows (early stopping's view of every epoch)"))
    resumed: dict = field(metadata=_doc("stage -> the epoch a rerun resumed after"))
    run: dict = field(metadata=_doc("the run's name, wandb group (the sweep), job type and swept values"))
    forget_softmax: dict = field(metadata=_doc("per stage, the softmax of the first forget images (the bar charts)"))
    assessment: Assessment = field(metadata=_doc("run/assessment.py's record; its keys at the top level (SPREAD)"))
    weights: dict = field(metadata=_doc("where the weights went; its keys at the top level (SPREAD)"))
    release: dict | None = field(default=None, metadata=_doc("the release folder written: folder, files, loadable, "
                                                             "protected", "once published"))

    def published(self, release: dict) -> "RunRecord":
        return replace(self, release=release)

    def to_json(self) -> dict:
        """results.json: the fields in order, the assessment's and the weights' keys at the top level."""
        out = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "assessment":
                out.update(value.record())
            elif item.name == "weights":
                out.update(value)
            elif value is not None:
                out[item.name] = value
        return out


# The keys the assessment and the weights put at the top level: (key, type, when present, what).
SPREAD = {
    "assessment": (
        ("attacks", "dict", "attacks.enabled", "per stage, per attack and radius: forget CD and accuracy"),
        ("attack_checks", "dict", "attacks.enabled", ("per stage: the attacks' sanity checks (zero-gradient share, "
                                                      "the worst case's attack)")),
        ("relearn", "dict", "attacks.enabled and the relearning attack on", ("per stage and number of steps: the "
                                                                             "relearning attack's worst case")),
        ("relearn_runs", "dict", "as relearn", "every relearning run (source, learning rate)"),
        ("relearn_floor", "dict", "as relearn, and A(D_r) trained", "the same finetuning of A(D_r): the floor"),
        ("certified", "dict", "a bound could be computed", "per stage and radius: the certified bound's summary"),
        ("certified_bound", "dict", "always", "per stage: which bound gave the certified CDs (or why none)"),
        ("certified_note", "str", "no bound could be computed", "why"),
        ("forget_per_image", "list", "always", ("every forget image by id: per stage its clean, attacked and "
                                               "certified CD and certified radius")),
        ("release_gate", "dict", "always", ("the gate's verdict: passed, folder, requirements, reasons, the "
                                           "images that fail")),
    ),
    "weights": (
        ("certificate", "dict", "a certified method", "the certificate as written (read back as a verifier will)"),
        ("weights_file", "str", "always", "the released weights, relative to the run folder"),
        ("audit_file", "str", "a certified method", "the private audit record (`verify --audit`)"),
        ("noise_free", "dict", "a certified method", "the noise-free optimum's scores (private)"),
        ("state_dict_file", "str", "`state_dict=true`", "the raw state_dict"),
    ),
}


def _schema_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, when present, what) of every top-level key, in the order to_json writes them (the
    assessment's and the weights' keys spread as to_json spreads them)."""
    rows = []
    for item in fields(RunRecord):
        if item.name in SPREAD:
            rows += SPREAD[item.name]
            continue
        kind = getattr(item.type, "__name__", str(item.type)).replace(" | None", "")
        rows.append((item.name, kind, item.metadata["when"], item.metadata["doc"]))
    return rows


def schema_table() -> str:
    """docs/results-json.md's reference table of results.json's top level, from RunRecord's fields."""
    return "\n".join(["| key | type | present | what |", "|---|---|---|---|",
                      *(f"| `{key}` | {kind} | {when} | {doc} |" for key, kind, when, doc in _schema_rows())])


def schema_keys() -> list[str]:
    """results.json's top-level keys in the order to_json writes them."""
    return [row[0] for row in _schema_rows()]
