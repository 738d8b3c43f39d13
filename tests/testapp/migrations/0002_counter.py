from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("queuety_testapp", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Counter",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                        verbose_name="ID")),
                ("name", models.CharField(max_length=64, unique=True)),
                ("value", models.IntegerField(default=0)),
            ],
        ),
    ]
