"""Code both sides share: the wire format, authentication, the update codec, checksums."""
