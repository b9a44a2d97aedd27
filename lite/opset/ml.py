"""Classic machine learning (ai.onnx.ml) and signal processing."""

from __future__ import annotations

from sporenet.lite.kernels import fft
from sporenet.lite.kernels.ml import label_encoder, linear_classifier, svm, tree_ensemble
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import declare

OPS = (
    declare(O.TREE_ENSEMBLE, kernel=tree_ensemble.TreeEnsemble),
    declare(O.LINEAR_CLASSIFIER, kernel=linear_classifier.LinearClassifier),
    declare(O.SVM, kernel=svm.SVM),
    declare(O.LABEL_ENCODER, kernel=label_encoder.LabelEncoder),
    declare(O.RFFT2D, kernel=fft.Rfft2d),
    declare(O.COMPLEX_PART, kernel=fft.ComplexPart),
)
