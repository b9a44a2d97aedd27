"""The end-to-end demo: cloud training -> one .spore file (and its int8 twin) -> device
runtime -> on-device personalization -> federated rounds across a small fleet.

    python -m sporenet.demo [--out DIR] [--epochs N] [--rounds N] [--clients N]

1. cloud: train a small CNN on the 8x8 digits (graph mode) and export it.
2. device: load the file with the NumPy-only runtime and measure accuracy and latency;
   quantize it to int8 (100 calibration digits) and measure the smaller file.
3. device: personalize: a user whose digits look different (thicker strokes) fine-tunes
   only the head on their own samples; the backbone stays bit-identical.
4. fleet: a real `sporenet-server` daemon runs FedAvg rounds over clients that each
   fine-tune the head on their own data; evaluation accuracy is printed per round.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sporenet import cloud, lite
from sporenet.lite import Interpreter, OpCode
from sporenet.lite.console import add_threads, apply_threads, make_parser, quiet_on_closed_pipe
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model


def head_parameters(model: lite.Model, output: str = "logits") -> set[str]:
    """Names of the weight and bias of the FullyConnected layer that produces `output`."""
    target = model.signature().outputs[output]
    for node in model.graphs[0].nodes:
        if target in node.outputs and node.op == OpCode.FULLY_CONNECTED:
            return {model.tensors[i].name for i in node.inputs[1:] if i != -1}
    raise ValueError(f"output {output!r} is not produced by a FullyConnected head")


def thicker_strokes(x: np.ndarray) -> np.ndarray:
    """One user's handwriting: strokes dilated by a pixel to the right and brighter."""
    shifted = np.zeros_like(x)
    shifted[..., 1:] = x[..., :-1]
    return np.clip(np.maximum(x, shifted) * 1.5, 0.0, 16.0).astype(np.float32)


def accuracy(interpreter: Interpreter, x: np.ndarray, y: np.ndarray) -> float:
    logits = interpreter.run({"input": x})["logits"]
    return float(np.mean(logits.argmax(axis=1) == y))


def fine_tune_head(
    model: lite.Model, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float = 3e-3, seed: int = 0
) -> Trainer:
    """Train only the head of `model` on (x, y) with the lite Trainer, as a device would."""
    train = make_training_model(
        model,
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("adam", lr=lr),
        trainable=head_parameters(model),
    )
    trainer = Trainer(train, num_threads=1)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), 32):
            batch = order[start : start + 32]
            trainer.step({"input": x[batch], "labels": y[batch]}, lr)
    return trainer


class EpochProgress(cloud.Callback):
    """One line per cloud training epoch, so the demo shows progress while it trains."""

    def on_epoch_begin(self, epoch: int, state: cloud.callbacks.TrainingState) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(
        self, epoch: int, logs: dict[str, float], state: cloud.callbacks.TrainingState
    ) -> None:
        print(
            f"[1/4] cloud: epoch {epoch + 1}/{state.epochs}, loss {logs['loss']:.4f} "
            f"({time.perf_counter() - self.start:.1f}s)",
            flush=True,
        )


def stage_cloud(out: Path, epochs: int) -> tuple[Path, cloud.datasets.Split]:
    print(
        f"[1/4] cloud: training a small CNN on the 8x8 digits for {epochs} epochs (graph mode)",
        flush=True,
    )
    data = cloud.load_digits()
    cloud.manual_seed(0)
    model = cloud.models.digits_cnn()
    schedule = cloud.schedules.CosineLR(3e-3, total_steps=epochs, min_lr=3e-3 / 20)
    start = time.perf_counter()
    cloud.fit(
        model,
        data.x_train,
        data.y_train,
        epochs=epochs,
        batch_size=32,
        optimizer=cloud.Adam(lr=3e-3),
        callbacks=[cloud.LearningRateScheduler(schedule), EpochProgress()],
        augment=cloud.datasets.random_shift,
        seed=0,
        verbose=0,
        mode="graph",
    )
    result = cloud.evaluate(model, data.x_test, data.y_test, mode="graph")
    path = out / "digits.spore"
    cloud.export(model, path, labels=data.labels, input_range=(0.0, 16.0))
    print(
        f"[1/4] cloud: trained a CNN on digits in {time.perf_counter() - start:.1f}s "
        f"({epochs} epochs): test accuracy {result['accuracy']:.4f}; exported {path.name} "
        f"({path.stat().st_size:,} bytes)"
    )
    return path, data


def stage_device(path: Path, data: cloud.datasets.Split) -> None:
    interpreter = Interpreter(model_path=path, num_threads=1)
    acc = accuracy(interpreter, data.x_test, data.y_test)
    one = data.x_test[:1]
    interpreter.run({"input": one})
    times = []
    for _ in range(200):
        start = time.perf_counter()
        interpreter.run({"input": one})
        times.append(time.perf_counter() - start)
    print(
        f"[2/4] device: lite runtime on {path.name}: test accuracy {acc:.4f}, "
        f"{np.median(times) * 1e6:.0f} us per image (median, batch 1, 1 thread)"
    )
    stage_compress(path, data)


def stage_compress(path: Path, data: cloud.datasets.Split) -> None:
    """Static int8 post-training quantization with 100 calibration digits, as
    `sporenet-convert --quantize int8` does it: the file a phone would receive."""
    from sporenet.converter.quantize import quantize_model

    result = quantize_model(
        path.read_bytes(), mode="int8", calibration={"input": data.x_train[:100]}, report=False
    )
    small = path.with_name(f"{path.stem}.int8.spore")
    small.write_bytes(result.data)
    acc = accuracy(Interpreter(model_path=small, num_threads=1), data.x_test, data.y_test)
    print(
        f"[2/4] device: int8 {small.name}: {len(result.data) / path.stat().st_size:.2f}x "
        f"the float file, test accuracy {acc:.4f}"
    )


def stage_personalize(path: Path, data: cloud.datasets.Split, epochs: int) -> None:
    model = lite.load(path)
    x_user = thicker_strokes(data.x_test)
    x_own, y_own = x_user[:200], data.y_test[:200]  # the user's labelled samples
    x_eval, y_eval = x_user[200:], data.y_test[200:]  # what they write next
    before = accuracy(Interpreter(model=model), x_eval, y_eval)
    trainer = fine_tune_head(model, x_own, y_own, epochs=epochs)
    tuned = trainer.export()
    after = accuracy(Interpreter(model=tuned), x_eval, y_eval)
    head = head_parameters(model)
    backbone_same = all(
        np.array_equal(t.data, u.data)
        for t, u in zip(model.tensors, tuned.tensors, strict=False)
        if t.data is not None and t.name not in head
    )
    print(
        f"[3/4] device: personalized the head on 200 of one user's digits: accuracy on "
        f"their next {len(y_eval)} went {before:.4f} -> {after:.4f} "
        f"(backbone unchanged: {backbone_same})"
    )


STAGE_TIMEOUT = 180.0
"""Seconds the federated stage may take before the demo gives up with the server's log."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stage_federated(
    path: Path, data: cloud.datasets.Split, out: Path, *, rounds: int, clients: int
) -> None:
    print(
        f"[4/4] fleet: starting a sporenet-server daemon and {clients} devices for "
        f"{rounds} FedAvg rounds",
        flush=True,
    )
    devices = _new_users(lite.load(path), data, clients)
    address = f"127.0.0.1:{_free_port()}"
    state = out / "server-state"
    server = _start_server(address, path, state, rounds=rounds, clients=clients)
    _wait_until_serving(address, server)
    start = time.perf_counter()
    try:
        finished = _run_devices(address, devices)
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    if not finished:
        raise RuntimeError(
            f"the federated rounds did not finish within {STAGE_TIMEOUT:.0f}s; "
            f"server log:\n{err[-4000:]}"
        )
    curve = ", ".join(
        f"round {r['round']}: {r['metrics'].get('accuracy', float('nan')):.4f}"
        for r in _evaluations(state, err)
    )
    print(
        f"[4/4] fleet: sporenet-server ran {rounds} FedAvg rounds over {clients} devices "
        f"in {time.perf_counter() - start:.1f}s; accuracy on the devices' own data: {curve}"
    )


def _start_server(
    address: str, model: Path, state: Path, *, rounds: int, clients: int
) -> subprocess.Popen:
    """The `sporenet-server` daemon as its own process, evaluating after every round."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sporenet.federated.server",
            "--address",
            address,
            "--model",
            str(model),
            "--state-dir",
            str(state),
            "--rounds",
            str(rounds),
            "--min-clients",
            str(clients),
            "--evaluate-every",
            "1",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@dataclass(frozen=True)
class _Device:
    """One device of the fleet: its own training shard and test set, and what it runs."""

    index: int
    base: lite.Model
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def train(self, weights: dict[str, np.ndarray], config: dict) -> tuple:
        trainer = fine_tune_head(
            lite.replace_weights(self.base, weights),
            self.x,
            self.y,
            epochs=2,
            seed=int(config.get("round", 0)) * 100 + self.index,
        )
        new = {**weights, **trainer.weights()}
        return {name: new[name] for name in weights}, len(self.y), {}

    def evaluate(self, weights: dict[str, np.ndarray], config: dict) -> tuple:
        interpreter = Interpreter(model=lite.replace_weights(self.base, weights))
        logits = interpreter.run({"input": self.x_test})["logits"]
        yt = self.y_test
        loss = float(
            -np.mean(
                logits[np.arange(len(yt)), yt]
                - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1))
                - logits.max(1)
            )
        )
        return loss, len(yt), {"accuracy": float(np.mean(logits.argmax(1) == yt))}


def _new_users(base: lite.Model, data: cloud.datasets.Split, clients: int) -> list[_Device]:
    """Each device holds a shard of new users' digits (thicker strokes) and its test set."""
    x_all = thicker_strokes(data.x_train)
    shards = np.array_split(np.random.default_rng(1).permutation(len(x_all)), clients)
    x_test = thicker_strokes(data.x_test)
    tests = np.array_split(np.arange(len(x_test)), clients)
    return [
        _Device(
            k,
            base,
            x_all[shards[k]],
            data.y_train[shards[k]],
            x_test[tests[k]],
            data.y_test[tests[k]],
        )
        for k in range(clients)
    ]


def _run_devices(address: str, devices: list[_Device]) -> bool:
    """Run every device's client in a thread until the job ends; False past the deadline."""
    from sporenet.federated import Client  # the federated extra (grpc) is needed only here

    def run_client(device: _Device) -> None:
        client = Client(
            address,
            train=device.train,
            evaluate=device.evaluate,
            name=f"device-{device.index}",
            poll_wait=1.0,
            give_up_after=STAGE_TIMEOUT,
        )
        try:
            client.run()
        finally:
            client.close()

    deadline = time.perf_counter() + STAGE_TIMEOUT
    # Daemon threads: a client still retrying at the deadline does not keep us alive.
    threads = [threading.Thread(target=run_client, args=(d,), daemon=True) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    return not any(t.is_alive() for t in threads)


def _evaluations(state: Path, server_log: str) -> list[dict]:
    """The evaluate rounds the server recorded, read with `sporenet-server status`."""
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "sporenet.federated.server",
            "status",
            "--json",
            "--state-dir",
            str(state),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if status.returncode != 0:
        raise RuntimeError(f"federated stage failed:\n{server_log}\n{status.stderr}")
    return [r for r in json.loads(status.stdout)["rounds"] if r["phase"] == "evaluate"]


def _wait_until_serving(address: str, server: subprocess.Popen) -> None:
    """Block until the daemon answers its health check, so the devices start against a
    running server instead of reporting refused connections while it starts."""
    import grpc  # the federated extra, as the client below
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + STAGE_TIMEOUT
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if server.poll() is not None:
                _, err = server.communicate(timeout=30)
                raise RuntimeError(f"the sporenet-server daemon exited at start:\n{err[-4000:]}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
            except grpc.RpcError:
                time.sleep(0.1)  # not listening yet: try again until the deadline
                continue
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.1)
    server.terminate()
    raise RuntimeError(f"the sporenet-server daemon did not start within {STAGE_TIMEOUT:.0f}s")


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    parser = make_parser("python -m sporenet.demo", " ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the model file and the server's state (default: a new temporary folder)",
    )
    parser.add_argument("--epochs", type=int, default=20, help="cloud training epochs")
    parser.add_argument("--rounds", type=int, default=3, help="federated rounds")
    parser.add_argument("--clients", type=int, default=4, help="federated devices (client threads)")
    add_threads(parser)
    args = parser.parse_args(argv)
    apply_threads(parser, args.threads)
    for name in ("epochs", "rounds", "clients"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="sporenet-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    path, data = stage_cloud(out, args.epochs)
    stage_device(path, data)
    stage_personalize(path, data, epochs=10)
    stage_federated(path, data, out, rounds=args.rounds, clients=args.clients)
    print(f"files in {out}")
    return 0


def run(argv: list[str] | None = None) -> int:
    """main, with Ctrl-C ending it with a line instead of a traceback."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(run())
