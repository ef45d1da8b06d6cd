"""The `kiln` command: local commands (serve, worker, token, user, model) and API client commands."""
