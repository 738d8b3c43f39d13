"""The demo project is also an app, so its ``demo`` management command is found."""

from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "project"
    verbose_name = "Queuety demo"
