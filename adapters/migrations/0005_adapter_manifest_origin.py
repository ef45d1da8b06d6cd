"""Adapter.manifest_sha256 and Adapter.uploaded: how a row was published, for `kiln adapters verify`.

Rows published before: an upload is the row whose history goes from nothing straight to available (a
trained adapter's is reserved first); their manifests were not recorded, so they stay empty (verify then treats a
missing manifest as an adapter published before manifests, as it did)."""

from django.db import migrations, models


def mark_uploads(apps, schema_editor):
    Adapter = apps.get_model("adapters", "Adapter")
    AdapterTransition = apps.get_model("adapters", "AdapterTransition")
    for adapter in Adapter.objects.all():
        # a trained adapter is reserved (-> writing) and then published (writing -> available/active);
        # an upload goes from nothing straight to available
        if AdapterTransition.objects.filter(adapter=adapter.name, at__gte=adapter.created_at, from_state="",
                                            to_state__in=("available", "active")).exists():
            adapter.uploaded = True
            adapter.save(update_fields=["uploaded"])


class Migration(migrations.Migration):

    dependencies = [
        ("adapters", "0004_adapter_quarantine_canary"),
    ]

    operations = [
        migrations.AddField(
            model_name="adapter",
            name="manifest_sha256",
            field=models.CharField(blank=True, max_length=80),
        ),
        migrations.AddField(
            model_name="adapter",
            name="uploaded",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(mark_uploads, migrations.RunPython.noop),
    ]
