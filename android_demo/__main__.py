"""python -m sporenet.android_demo: the device app (see cli.py)."""

from sporenet.android_demo.cli import main

raise SystemExit(main())
