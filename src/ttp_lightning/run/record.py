"""The run's record: results.json's top level as one frozen dataclass, built once at the end of a run from the
parts each stage returned, each a frozen record built once by the stage that owns it: every stage's metrics
(`StageMetrics`: its evaluation and what made the model reported), the assessment (run/assessment.py: attacks,
every forget image, the gate's `GateVerdict`), the weights (`Weights`, with a certified method's
`WrittenCertificate`) and the release folder (`Release`). results.json is written from it. Its fields'
documentation is the reference table in docs/results-json.md (`python scripts/results_table.py`, checked by
tests/test_docs.py)."""

import types
from dataclasses import dataclass, field, fields, replace

from ttp_lightning.assess.frontier import Frontier
from ttp_lightning.assess.protection import GateVerdict
from ttp_lightning.certified.certificate.document import WrittenCertificate
from ttp_lightning.run.assessment import Assessment


def _doc(text: str, when: str = "always") -> dict:
    return {"doc": text, "when": when}


@dataclass(frozen=True)
class StageMetrics:
    """One stage's metrics as the stage built them: its evaluation (assess/evaluation.evaluate: accuracy and CD per
    part, the forget set's worst image) and what made the model reported (pretraining's record; the method's own
    numbers and whether its weights changed). The assessment's per-image summary is the assessment's part; the
    record joins them in results.json."""

    evaluation: dict[str, float]
    reported: dict = field(default_factory=dict)

    def to_json(self, assessed: dict) -> dict:
        return {**self.evaluation, **self.reported, **assessed}


@dataclass(frozen=True)
class Weights:
    """Where the run's weights went: a certified method's certificate as written (its weights named in it), else
    the release's model.safetensors (and the raw state_dict when asked)."""

    weights_file: str
    certificate: WrittenCertificate | None = None
    audit_file: str | None = None
    noise_free: dict | None = None
    state_dict_file: str | None = None

    def to_json(self) -> dict:
        """results.json's keys of the weights, in SPREAD's order."""
        values = {"certificate": None if self.certificate is None else self.certificate.document,
                  "weights_file": self.weights_file, "audit_file": self.audit_file, "noise_free": self.noise_free,
                  "state_dict_file": self.state_dict_file}
        return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class Release:
    """The release folder publish() wrote (release/ or release_not_protected/), its files, whether
    `load_released` can rebuild the model from it, and whether the gate released it as protected."""

    folder: str = field(metadata={"doc": "release or release_not_protected (the gate's folder)"})
    files: tuple[str, ...] = field(metadata={"doc": "the files written there: model.safetensors, config.json, "
                                                    "README.md"})
    loadable: bool = field(metadata={"doc": "whether load_released can rebuild the architecture (a registered "
                                            "model config)"})
    protected: bool = field(metadata={"doc": "the gate's verdict"})

    def to_json(self) -> dict:
        return {"folder": self.folder, "files": list(self.files), "loadable": self.loadable,
                "protected": self.protected}


@dataclass(frozen=True)
class RunRecord:
    format: str = field(metadata=_doc("the results format: `ttp_lightning.results/2` (files without the key are /1, "
                                      "whose bound-based keys said certified; `ttp_lightning.tables` reads both)"))
    experiment: str = field(metadata=_doc("the experiment's name (`experiment_name`: `<data>_<model>` unless an "
                                          "experiment file names it)"))
    method: str = field(metadata=_doc("the method's name (`method.name`), the key of its stage in `metrics`"))
    config: dict = field(metadata=_doc("the resolved config the run composed (its record; the run read typed "
                                       "settings)"))
    data: dict = field(metadata=_doc("sizes, the forget set's indices, fingerprint and digest"))
    metrics: dict[str, StageMetrics] = field(metadata=_doc(
        "per stage (`pretrain`, the method, `pretrain_original` when forget instances came from the test set): "
        "evaluation, the method's own numbers and the assessment's per-image summary"))
    history: dict = field(metadata=_doc("the method's per-epoch rows (early stopping's view of every epoch)"))
    resumed: dict = field(metadata=_doc("stage -> the epoch a rerun resumed after"))
    run: dict = field(metadata=_doc("the run's name, wandb group (the sweep), job type and swept values"))
    forget_softmax: dict = field(metadata=_doc("per stage, the softmax of the first forget images (the bar charts)"))
    assessment: Assessment = field(metadata=_doc("run/assessment.py's record; its keys at the top level (SPREAD)"))
    weights: Weights | None = field(default=None, metadata=_doc("where the weights went; its keys at the top level "
                                                                "(SPREAD)", "once written"))
    release: Release | None = field(default=None, metadata=_doc("the release folder written: folder, files, "
                                                                "loadable, protected", "once published"))

    @property
    def gate(self) -> GateVerdict:
        return self.assessment.release_gate

    def stage_json(self, stage: str) -> dict:
        """results.json's metrics of one stage: its own and the assessment's."""
        return self.metrics[stage].to_json(self.assessment.stage_metrics(stage))

    def with_weights(self, weights: Weights) -> "RunRecord":
        return replace(self, weights=weights)

    def published(self, release: Release) -> "RunRecord":
        return replace(self, release=release)

    def to_json(self) -> dict:
        """results.json: the fields in order, the assessment's and the weights' keys at the top level."""
        out = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "metrics":
                out["metrics"] = {stage: self.stage_json(stage) for stage in value}
            elif item.name in SPREAD:
                out.update(value.to_json() if value is not None else {})
            elif isinstance(value, Release):
                out[item.name] = value.to_json()
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
        ("proven", "dict", "a bound could be computed", "per stage and radius: the proven bound's summary"),
        ("proof_bound", "dict", "always", "per stage: which bound gave the proven CDs (or why none)"),
        ("proof_note", "str", "no bound could be computed", "why"),
        ("forget_per_image", "list", "always", ("every forget image by id: per stage its clean, attacked and "
                                               "proven CD and proven radius")),
        ("release_gate", "dict", "always", ("the gate's verdict: passed, folder, requirements, reasons, the "
                                           "images that fail")),
        ("frontier", "dict", "a robust Alg 1 release refused", ("its price: per training radius its best epoch, "
                                                                "the kept weights at each attack radius, the "
                                                                "overrides that would release and their cost")),
    ),
    "weights": (
        ("certificate", "dict", "a certified method", "the certificate as written: the document parsed from the very text in the file, what a verifier reads"),
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
        kind = "dict" if item.name in ("release", "metrics") else getattr(item.type, "__name__", str(item.type))
        if item.name in SPREAD:
            rows += SPREAD[item.name]
            continue
        rows.append((item.name, kind, item.metadata["when"], item.metadata["doc"]))
    return rows


def results_table() -> str:
    """docs/results-json.md's reference tables: results.json's top level from RunRecord's fields, then the keys
    of `release_gate` (GateVerdict) and `release` (Release) from theirs."""
    top = ["| key | type | present | what |", "|---|---|---|---|",
           *(f"| `{key}` | {kind} | {when} | {doc} |" for key, kind, when, doc in _schema_rows())]
    return "\n".join([*top, *_part_table("release_gate", GateVerdict), *_part_table("release", Release),
                      *_part_table("frontier", Frontier)])


def _part_table(key: str, record: type) -> list[str]:
    """The keys of one record's object in results.json, from its fields' docs (and its DERIVED keys)."""
    rows = [(item.name, _json_kind(item.type), item.metadata["doc"]) for item in fields(record)]
    rows += list(getattr(record, "DERIVED", ()))
    return ["", f"`{key}` ({record.__name__}):", "", "| key | type | what |", "|---|---|---|",
            *(f"| `{name}` | {kind} | {doc} |" for name, kind, doc in rows)]


JSON_KINDS = {bool: "bool", str: "str", float: "number", int: "integer", tuple: "list", list: "list", dict: "dict"}


def _json_kind(kind) -> str:
    """A field's type as JSON names it (`float | None`: number or null)."""
    optional = isinstance(kind, types.UnionType) and type(None) in kind.__args__
    base = next(arg for arg in kind.__args__ if arg is not type(None)) if optional else kind
    name = JSON_KINDS.get(getattr(base, "__origin__", base), "object")
    return f"{name} or null" if optional else name


def results_keys() -> list[str]:
    """results.json's top-level keys in the order to_json writes them."""
    return [row[0] for row in _schema_rows()]
