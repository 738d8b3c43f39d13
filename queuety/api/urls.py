"""API URLs; mount under any prefix: ``path("queuety/api/", include("queuety.api.urls"))``."""

from django.urls import path, re_path

from queuety.api import artifacts, bulk, control, events, hooks, jobs, queues, views

app_name = "queuety"

urlpatterns = [
    path("runs/", control.RunListView.as_view(), name="run-list"),
    path("runs/bulk/", bulk.BulkView.as_view(), name="run-bulk"),
    path("runs/bulk/<int:pk>/", bulk.BulkDetailView.as_view(), name="run-bulk-detail"),
    path("runs/bulk/<int:pk>/cancel/", bulk.BulkCancelView.as_view(), name="run-bulk-cancel"),
    path("runs/<int:pk>/", views.RunDetailView.as_view(), name="run-detail"),
    path("runs/<int:pk>/cancel/", control.CancelView.as_view(), name="run-cancel"),
    path("runs/<int:pk>/pause/", control.PauseView.as_view(), name="run-pause"),
    path("runs/<int:pk>/resume/", control.ResumeView.as_view(), name="run-resume"),
    path("runs/<int:pk>/retry/", control.RetryView.as_view(), name="run-retry"),
    path("runs/<int:pk>/edit-state/", control.EditStateView.as_view(), name="run-edit-state"),
    path("workflows/", control.WorkflowListView.as_view(), name="workflows"),
    path("workflows/<str:name>/definitions/<str:hash>/pause/",
         control.PauseDefinitionView.as_view(), name="definition-pause"),
    path("workflows/<str:name>/definitions/<str:hash>/resume/",
         control.ResumeDefinitionView.as_view(), name="definition-resume"),
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
    path("events/", events.EventListView.as_view(), name="event-list"),
    path("queues/", queues.QueueListView.as_view(), name="queue-list"),
    path("queues/<str:name>/pause/", queues.PauseQueueView.as_view(), name="queue-pause"),
    path("queues/<str:name>/resume/", queues.ResumeQueueView.as_view(), name="queue-resume"),
    path("approvals/<str:token>/", views.ApprovalPageView.as_view(), name="approval-page"),
    path("schema/", views.SchemaView.as_view(), name="schema"),
    path("jobs/", jobs.JobListView.as_view(), name="job-list"),
    path("jobs/<int:pk>/", jobs.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:pk>/retry/", jobs.JobRetryView.as_view(), name="job-retry"),
    path("jobs/<int:pk>/cancel/", jobs.JobCancelView.as_view(), name="job-cancel"),
    path("hooks/<str:name>/", hooks.InboundHookView.as_view(), name="inbound-hook"),
    # Last: paths no endpoint matches (``runs/-1/``, ``runs/abc/``) get a JSON 404 too.
    re_path(r"^(?P<path>.*)$", views.not_found),
]
