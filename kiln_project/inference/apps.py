from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "kiln_project.inference"
    label = "inference"
    verbose_name = "Inference"
