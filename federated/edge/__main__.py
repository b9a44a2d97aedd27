"""`python -m sporenet.federated.edge`: the same as the `sporenet-edge` command."""

import sys

from sporenet.federated.edge.cli import main

sys.exit(main())
