from django.apps import AppConfig


class ServingConfig(AppConfig):
    """The model service: the OpenAI-compatible routes, the in-cluster client and the GPU worker's host.
    An app of its own so the worker finds its `tasks` module (the infer actor)."""

    name = "adapters.serving"
    label = "inference"  # kept from before the move
    verbose_name = "Inference"
