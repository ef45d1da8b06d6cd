"""The chain verifier (`adapters.verify`, issue 13): GET /v1/adapters/{name}/verify, `kiln adapters verify`."""
