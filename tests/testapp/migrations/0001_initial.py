from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Article",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                        verbose_name="ID")),
                ("token", models.CharField(db_index=True, max_length=40)),
                ("title", models.CharField(default="", max_length=200)),
                ("status", models.CharField(default="draft", max_length=20)),
                ("run_id", models.BigIntegerField(blank=True, null=True)),
            ],
        ),
    ]
