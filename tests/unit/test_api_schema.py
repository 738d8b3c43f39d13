"""The OpenAPI schema with a site's settings as they come: no DRF ``DEFAULT_SCHEMA_CLASS``, no
``SPECTACULAR_SETTINGS``, and DRF views of the site's own beside Queuety's (no database)."""

from __future__ import annotations

import json

from django.test import Client, override_settings
from django.urls import include, path
from drf_spectacular.checks import schema_check
from rest_framework.response import Response
from rest_framework.views import APIView

import queuety

# DRF's own defaults: in particular no DEFAULT_SCHEMA_CLASS, so DRF's AutoSchema is the default.
PLAIN_DRF = {"DEFAULT_AUTHENTICATION_CLASSES": [
    "rest_framework.authentication.SessionAuthentication",
    "rest_framework.authentication.BasicAuthentication"]}
API = "/queuety/api"


class ShopView(APIView):
    """A view of the site's own, on DRF's default schema class."""

    def get(self, request):
        return Response({})


urlpatterns = [
    path("queuety/api/", include("queuety.api.urls")),
    path("shop/", ShopView.as_view()),
]


def schema() -> dict:
    response = Client().get(f"{API}/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200, response.content[:2000]
    return json.loads(response.content)


@override_settings(REST_FRAMEWORK=PLAIN_DRF)
def test_schema__served_without_a_default_schema_class_titled_and_versioned():
    served = schema()
    assert served["info"]["title"] == "Queuety API"
    assert served["info"]["version"] == queuety.__version__
    assert {f"{API}/runs/{{id}}/", f"{API}/runs/{{id}}/approve/", f"{API}/waits/",
            f"{API}/runs/{{id}}/signals/{{name}}/"} <= set(served["paths"])
    assert "Error" in served["components"]["schemas"]


@override_settings(REST_FRAMEWORK=PLAIN_DRF, ROOT_URLCONF=__name__,
                   SPECTACULAR_SETTINGS={"TITLE": "Shop API", "VERSION": "7"})
def test_schema__holds_queuetys_endpoints_only_whatever_the_site_serves_beside():
    served = schema()
    assert served["info"]["title"] == "Queuety API"
    assert all(name.startswith(f"{API}/") for name in served["paths"])


@override_settings(REST_FRAMEWORK=PLAIN_DRF)
def test_check_deploy__drf_spectacular_generates_the_sites_schema_without_error():
    found = schema_check(None)
    assert [message for message in found if message.id == "drf_spectacular.E001"] == []


@override_settings(REST_FRAMEWORK=PLAIN_DRF)
def test_check_deploy__queuetys_operation_ids_do_not_collide():
    warnings = [str(message.msg) for message in schema_check(None)
                if message.id.startswith("drf_spectacular.")]
    assert warnings == []
    operations = [operation["operationId"] for path in schema()["paths"].values()
                  for operation in path.values() if isinstance(operation, dict)
                  and "operationId" in operation]
    assert len(operations) == len(set(operations)) and "runs_list" in operations


@override_settings(REST_FRAMEWORK=PLAIN_DRF)
def test_schema__the_inbound_hook_endpoint_with_each_answer_and_no_user_auth():
    operation = schema()["paths"][f"{API}/hooks/{{name}}/"]["post"]
    assert {"200", "202", "400", "401", "404", "413"} <= set(operation["responses"])
    # Authenticated by the delivery's signature: no credentials are documented for it.
    assert operation.get("security") in (None, [], [{}])
