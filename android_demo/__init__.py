"""sporenet.android_demo: the device app and the fleet simulator.

The app (`python -m sporenet.android_demo --model M.spore --data-dir DIR`) serves a local
page and a JSON API on 127.0.0.1: draw a digit, see the prediction, correct its label,
personalize the model's head on your own samples, and optionally take part in federated
rounds when the device policy allows. Pure Python on numpy, flatbuffers and grpcio, so it
runs under Termux on an Android phone. See android_demo/README.md.
"""
