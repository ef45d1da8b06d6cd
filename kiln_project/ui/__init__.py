"""The server-rendered dashboard at /ui/: pages, partials and the live-update consumers."""
