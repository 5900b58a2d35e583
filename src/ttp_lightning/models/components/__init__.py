"""Classifiers that take [0, 1] pixels (normalisation inside) and end in an affine layer + softmax."""

from ttp_lightning.models.components.classifier import Classifier, build_classifier

__all__ = ["Classifier", "build_classifier"]
