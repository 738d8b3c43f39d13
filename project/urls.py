"""URLs of the demo project."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("queuety/api/", include("queuety.api.urls")),
]
