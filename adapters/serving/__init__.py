"""OpenAI-compatible inference: the web side validates and enqueues, the GPU worker samples."""
