"""`python -m sporenet.federated.client`: the sporenet-client command."""

import sys

from sporenet.federated.client.cli import main

sys.exit(main())
