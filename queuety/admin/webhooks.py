"""The webhooks admin: endpoints (URL, events, secret, active) and their delivery log.

The secret is write-only: its field is a password input that never renders the stored value,
left blank on an endpoint's page it keeps the current one, and no list, page or log shows it.
Deliveries are read-only; the ``Redeliver`` action sends chosen ones again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from queuety import scope
from queuety.admin.display import pretty_json
from queuety.models import WebhookDelivery, WebhookEndpoint
from queuety.signals import BY_WEBHOOK
from queuety.webhooks import delivery

if TYPE_CHECKING:  # generic in django-stubs only: not subscriptable at run time
    _EndpointForm = forms.ModelForm[WebhookEndpoint]
    _EndpointAdmin = admin.ModelAdmin[WebhookEndpoint]
    _DeliveryAdmin = admin.ModelAdmin[WebhookDelivery]
else:
    _EndpointForm = forms.ModelForm
    _EndpointAdmin = _DeliveryAdmin = admin.ModelAdmin


class EndpointForm(_EndpointForm):
    """The endpoint's form: events as checkboxes, the secret write-only."""

    url = forms.URLField(max_length=2000, assume_scheme="https",
                         help_text="Where deliveries are POSTed (http or https).")
    events = forms.MultipleChoiceField(
        choices=[(name, name) for name in BY_WEBHOOK], widget=forms.CheckboxSelectMultiple,
        help_text="The events this endpoint receives (docs/guide/observability.md).")
    secret = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="Signs each delivery (HMAC-SHA256, header Queuety-Signature). Never shown "
                  "again once saved; leave blank to keep the current secret.")

    class Meta:
        model = WebhookEndpoint
        fields = ["url", "events", "secret", "active", "description"]

    def clean_url(self) -> str:
        url = str(self.cleaned_data["url"])
        if urlsplit(url).scheme not in ("http", "https"):
            raise forms.ValidationError(f"The URL {url!r} must start with http:// or https://.")
        return url

    def clean_secret(self) -> str:
        secret = str(self.cleaned_data.get("secret") or "")
        if secret:
            if len(secret) < 16:
                raise forms.ValidationError("The secret must be at least 16 characters; a "
                                            "random one such as `python -c \"import secrets; "
                                            "print(secrets.token_urlsafe(32))\"` is best.")
            return secret
        if self.instance.pk:  # blank: keep the stored secret
            return str(self.instance.secret)
        raise forms.ValidationError("Enter a secret (at least 16 characters): the endpoint "
                                    "verifies each delivery's signature with it.")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(_EndpointAdmin):
    """Endpoints: where events are POSTed. The secret column is never listed."""

    form = EndpointForm
    list_display = ("url", "event_list", "active", "description", "created_at")
    list_filter = ("active",)
    search_fields = ("url", "description")

    @admin.display(description="events")
    def event_list(self, endpoint: WebhookEndpoint) -> str:
        return ", ".join(endpoint.events or ())


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(_DeliveryAdmin):
    """The delivery log: each event sent to each endpoint, its status and last answer."""

    list_display = ("pk", "event", "endpoint_url", "run_id", "status", "attempts",
                    "last_status_code", "created_at", "delivered_at")
    list_filter = ("status", "event")
    search_fields = ("=run_id", "=event_id")
    ordering = ("-pk",)
    actions = ["redeliver"]
    readonly_fields = ("endpoint_url", "event", "event_id", "run_id", "status", "attempts",
                       "next_attempt_at", "last_attempt_at", "last_status_code", "last_error",
                       "created_at", "delivered_at", "payload_json")
    fields = readonly_fields
    list_select_related = ("endpoint",)

    @admin.display(description="endpoint")
    def endpoint_url(self, row: WebhookDelivery) -> str:
        return str(row.endpoint.url)

    @admin.display(description="payload")
    def payload_json(self, row: WebhookDelivery) -> Any:
        return format_html("<pre>{}</pre>", pretty_json(row.payload)[0])

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookDelivery]:
        # A delivery carries its run's data: only those of runs in the user's RUN_SCOPE
        # (and those of no run), in the log, its search, its pages and the redeliver action.
        return scope.through_runs(request.user, super().get_queryset(request), "run_id",
                                  unowned=True)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Redeliver the selected deliveries", permissions=["view"])
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        if not request.user.has_perm("queuety.change_webhookendpoint"):
            self.message_user(request, "Redelivering needs the permission to change webhook "
                              "endpoints.", messages.ERROR)
            return
        queued = delivery.redeliver(list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{queued} deliveries queued to be sent again.",
                          messages.SUCCESS)
