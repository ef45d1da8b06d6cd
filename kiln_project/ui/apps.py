from django.apps import AppConfig


class UiConfig(AppConfig):
    name = "kiln_project.ui"
    label = "ui"
    verbose_name = "Dashboard"
