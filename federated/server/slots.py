"""How many payload streams the server moves at once: the transfer slots.

Each upload being received holds its update in memory, so the receiving slots, not the
number of clients, bound the server's transfer memory. The Session service takes a slot
for every download and upload; the servicer one for every secure message.
"""

from __future__ import annotations

from sporenet.federated.server.config import ServerConfig


def transfer_split(
    max_transfers: int, *, update_bytes: int = 0, upload_memory: int = 0
) -> tuple[int, int]:
    """(download slots, upload receiving slots) out of `max_transfers`, half each.

    With `update_bytes` and `upload_memory`, no more receiving slots than that memory
    holds updates (each slot holds one in memory), one at least.
    """
    uploads = max(1, max_transfers // 2)
    downloads = max(1, max_transfers - uploads)
    if update_bytes > 0 and upload_memory > 0:
        uploads = max(1, min(uploads, upload_memory // update_bytes))
    return downloads, uploads


def transfer_slots(config: ServerConfig, update_bytes: int) -> tuple[int, int]:
    """(download slots, upload receiving slots) for a job whose raw update takes
    `update_bytes`: `max_transfers` split in half, with no more receiving slots than
    `max_upload_memory` holds."""
    return transfer_split(
        config.max_transfers, update_bytes=update_bytes, upload_memory=config.max_upload_memory
    )
