"""A federated client written against the SDK: train the head of a .spore model on one
shard of the 8x8 digits with the lite runtime, round after round.

    python examples/train_digits.py --out digits.spore
    sporenet-server --model digits.spore --state-dir state --rounds 3 --min-clients 2 &
    python examples/federated_client.py --model digits.spore --shard 0 --shards 2 &
    python examples/federated_client.py --model digits.spore --shard 1 --shards 2

`train(weights, config)` gets the round's global weights (the tensors the job trains)
and returns (new weights, samples used, metrics); `evaluate` returns (loss, samples,
metrics). `Client(...).run()` registers, serves the server's rounds until the job ends
and returns the final weights. `sporenet-client` does the same for a folder of .npz
files, and `sporenet.federated.client.lite_client.LiteLearner` wraps this pattern.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sporenet import cloud, lite
from sporenet.federated import Client
from sporenet.lite.console import add_threads, apply_threads, make_parser
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("federated_client.py", __doc__.splitlines()[0])
    parser.add_argument("--server", default="127.0.0.1:8080", help="the sporenet-server")
    parser.add_argument("--model", required=True, type=Path, help="the model the server runs")
    parser.add_argument("--shard", type=int, default=0, help="which shard of the digits is ours")
    parser.add_argument("--shards", type=int, default=1, help="how many clients share them")
    parser.add_argument("--name", default=None, help="this client's name (default: shard-N)")
    add_threads(parser)
    args = parser.parse_args(argv)
    apply_threads(parser, args.threads)
    if not 0 <= args.shard < args.shards:
        parser.error(f"--shard must be in [0, {args.shards - 1}]")

    # This client's data: every shards-th training image, and the same share of the test.
    data = cloud.load_digits()
    x, y = data.x_train[args.shard :: args.shards], data.y_train[args.shard :: args.shards]
    xt, yt = data.x_test[args.shard :: args.shards], data.y_test[args.shard :: args.shards]

    # One training model and Trainer, built once: the head (weight and bias of the last
    # layer) trains, the rest of the network stays as the server sent it.
    model = lite.load(args.model)
    train_model = make_training_model(
        model,
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("sgd", lr=0.05),
        trainable={"head.weight", "head.bias"},
    )
    trainer = Trainer(train_model)
    rng = np.random.default_rng(args.shard)

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        trainer.set_weights(weights)  # the round's global model
        trainer.reset_optimizer()
        loss = 0.0
        for _ in range(int(config.get("epochs", 1))):
            order = rng.permutation(len(y))
            for at in range(0, len(y), 32):
                rows = order[at : at + 32]
                loss = trainer.step({"input": x[rows], "labels": y[rows]})
        # Every tensor the server sent goes back: the head trained, the rest as it came.
        trained = trainer.weights()
        new = {k: trained.get(k, w) for k, w in weights.items()}
        return new, len(y), {"loss": loss}

    def evaluate(weights: dict[str, np.ndarray], config: dict) -> tuple:
        trainer.set_weights(weights)
        logits = trainer.evaluate({"input": xt})["logits"].astype(np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(yt)), yt] + 1e-12).mean())
        return loss, len(yt), {"accuracy": float(np.mean(logits.argmax(axis=1) == yt))}

    client = Client(
        args.server, train=train, evaluate=evaluate, name=args.name or f"shard-{args.shard}"
    )
    print(f"shard {args.shard}: {len(y)} images to train on, joining {args.server}", flush=True)
    try:
        final = client.run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        client.close()
    if final is not None:
        accuracy = evaluate(final, {})[2]["accuracy"]
        print(f"the job finished: final model {accuracy:.4f} on this shard's test images")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
