"""python -m sporenet.android_demo.fleet: the fleet simulator (see cli.py)."""

from sporenet.android_demo.fleet.cli import main

raise SystemExit(main())
