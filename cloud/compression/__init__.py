"""sporenet.cloud.compression: smaller models from the cloud, for the device.

Unstructured magnitude pruning (a fit callback with a polynomial sparsity schedule; the
exported file stores the pruned weights sparse), structured channel pruning (the pruned
model is physically smaller and faster) and quantization-aware training with export to
an int8 .spore through the converter's quantizer.

    from sporenet import cloud
    from sporenet.cloud import compression as C

    # 80% sparsity, reached by step 600 and held while fine-tuning
    pruning = C.Pruning(C.PolynomialSparsity(0.8, begin_step=0, end_step=600))
    cloud.fit(model, x, y, epochs=10, callbacks=[pruning])
    C.export_sparse(model, "pruned.spore")          # ~0.3x the dense file

    # half the channels of every prunable layer, residual groups kept consistent
    smaller = C.prune_channels(cloud.to_inference_ir(model), 0.5)

    qat = C.prepare_qat(model, x[:200])             # BatchNorm folded, fake-quant inserted
    cloud.fit(qat, x, y, epochs=3, optimizer=cloud.Adam(lr=1e-4))
    open("int8.spore", "wb").write(C.export_int8(qat, x[:200]).data)
"""

from sporenet.cloud.compression.export import export_sparse, sparse_int8
from sporenet.cloud.compression.pruning import (
    PolynomialSparsity,
    Pruning,
    magnitude_masks,
    prunable_weights,
    prune_now,
    sparsity_of,
)
from sporenet.cloud.compression.qat import (
    FakeQuant,
    WeightFakeQuant,
    calibrate_ranges,
    export_int8,
    fold_batch_norms,
    prepare_qat,
    range_of,
    strip_fake_quant,
)
from sporenet.cloud.compression.structured import channel_counts, prune_channels

__all__ = [
    "FakeQuant",
    "PolynomialSparsity",
    "Pruning",
    "WeightFakeQuant",
    "calibrate_ranges",
    "channel_counts",
    "export_int8",
    "export_sparse",
    "fold_batch_norms",
    "magnitude_masks",
    "prepare_qat",
    "prunable_weights",
    "prune_channels",
    "prune_now",
    "range_of",
    "sparse_int8",
    "sparsity_of",
    "strip_fake_quant",
]
