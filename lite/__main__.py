"""`python -m sporenet.lite MODEL`: the same as `sporenet-inspect MODEL`."""

from sporenet.lite.inspect_cli import main

raise SystemExit(main())
