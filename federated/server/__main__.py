"""`python -m sporenet.federated.server` is `sporenet-server`."""

import sys

from sporenet.federated.server.cli import main

sys.exit(main())
