"""Users' API tokens (stored hashed) and how API requests are authenticated."""
