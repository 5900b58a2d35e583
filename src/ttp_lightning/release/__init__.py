"""What a provider publishes: `release/model.safetensors` (no pickle), `release/config.json` (what rebuilds
the architecture and what inputs it expects) and `release/README.md`; and `load_released(DIR)`.

The weights are the network's own state_dict (the names the provider's checkpoint had, no `backbone.`
prefix), so code that loaded the original model loads the protected one unchanged. (A certified release keeps
the file its certificate hashes, under the classifier's `backbone.` names; config.json says so in
`weights.prefix`.) The network takes
pixels in [0, 1] normalised by `input.mean` / `input.std` from config.json (all zeros and ones when the
model was given raw pixels, data.normalize=false); `load_released` returns a module that normalises itself.

config.json is untrusted input to whoever loads it: it may only name a registered model config (files under
conf/model) with typed settings, checked by the same allowlist as a certificate, and nothing in it is ever
imported or instantiated; the weights file must match the SHA-256 it records.
"""

from ttp_lightning.release.card import card_cells, effect_rows, model_card
from ttp_lightning.release.format import (
    CARD,
    CONFIG,
    MAX_SLOPE_STEPS,
    WEIGHTS,
    not_protected_line,
    read_release_config,
)
from ttp_lightning.release.load import NotProtectedWarning, load_released, network_of
from ttp_lightning.release.publish import architecture_of, release_protection, write_hub_release

__all__ = ["CARD", "CONFIG", "MAX_SLOPE_STEPS", "WEIGHTS", "NotProtectedWarning", "architecture_of", "card_cells",
           "effect_rows", "load_released", "model_card", "network_of", "not_protected_line", "read_release_config",
           "release_protection", "write_hub_release"]
