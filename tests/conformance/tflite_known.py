"""Cases of the TFLite conformance suite known to fail today, each with its reason
(strict xfails: one that starts passing fails the run until it is removed here).

Regenerate with `python -m tests.conformance.tflite_suite --write-known`, then
`ruff format` it.
"""

KNOWN_FAILURES: dict[str, str] = {}
