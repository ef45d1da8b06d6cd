from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "core.metrics"
    label = "metrics"
    verbose_name = "Metrics"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from core.metrics.gauges import register_kernel_gauges

        register_kernel_gauges()
