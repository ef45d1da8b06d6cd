"""A counter series: one row per (family, label values), its value only ever growing.

Rows, not process memory: the web process and the two workers each count, and a restart of any of
them must not reset what the others counted. The row is updated in the transaction of the change it
counts, so a counted event and its count commit or roll back together."""

from django.db import models


class MetricCounter(models.Model):
    family = models.CharField(max_length=96)
    # The series' labels as Prometheus writes them (`code="x",stage="y"`, names sorted): closed values only.
    labels = models.CharField(max_length=400, blank=True)
    value = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["family", "labels"], name="metrics_counter_one_series")]

    def __str__(self):
        return f"{self.family}{{{self.labels}}} {self.value}"
