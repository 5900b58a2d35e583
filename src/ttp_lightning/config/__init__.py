"""The typed settings: config schemas registered in Hydra's ConfigStore, the pre-flight check of config-group
choices, and the default experiment name."""
