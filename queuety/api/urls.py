"""API URLs; mount under any prefix: ``path("queuety/api/", include("queuety.api.urls"))``."""

from django.urls import path, re_path

from queuety.api import artifacts, views

app_name = "queuety"

urlpatterns = [
    path("runs/<int:pk>/", views.RunDetailView.as_view(), name="run-detail"),
    path("runs/<int:pk>/signals/<str:name>/", views.SignalView.as_view(), name="run-signal"),
    path("runs/<int:pk>/approve/", views.ApproveView.as_view(), name="run-approve"),
    path("runs/<int:pk>/reject/", views.RejectView.as_view(), name="run-reject"),
    path("runs/<int:pk>/input/", views.InputView.as_view(), name="run-input"),
    path("runs/<int:pk>/artifacts/", artifacts.ArtifactListView.as_view(),
         name="run-artifacts"),
    path("runs/<int:pk>/artifacts/<str:key>/", artifacts.ArtifactView.as_view(),
         name="run-artifact"),
    path("runs/<int:pk>/artifacts/<str:key>/download/",
         artifacts.ArtifactDownloadView.as_view(), name="run-artifact-download"),
    path("runs/<int:pk>/steps/<str:step>/chunks/", artifacts.ChunkListView.as_view(),
         name="run-step-chunks"),
    path("runs/<int:pk>/steps/<str:step>/chunks/stream/", artifacts.ChunkStreamView.as_view(),
         name="run-step-chunk-stream"),
    path("waits/", views.WaitsView.as_view(), name="waits"),
    path("approvals/<str:token>/", views.ApprovalPageView.as_view(), name="approval-page"),
    path("schema/", views.SchemaView.as_view(), name="schema"),
    # Last: paths no endpoint matches (``runs/-1/``, ``runs/abc/``) get a JSON 404 too.
    re_path(r"^(?P<path>.*)$", views.not_found),
]
