from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0003_delete_others_jobs_permission'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='publishing',
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
