"""`python -m sporenet.converter ...`: the same as `sporenet-convert ...`."""

from sporenet.converter.cli import main

raise SystemExit(main())
