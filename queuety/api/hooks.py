"""``POST hooks/<name>/``: the endpoint of the inbound webhooks (``queuety.inbound``).

Authenticated by the delivery's signature, not by a user: no DRF authentication, permission
or CSRF check applies (a provider has no session or token here). The work is
``queuety.hooks.receive``; this view maps its refusals to JSON errors.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers as drf
from rest_framework import status
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queuety import exceptions, verifiers
from queuety.api.serializers import ErrorSerializer
from queuety.hooks import receive

logger = logging.getLogger("queuety")


class DeliverySerializer(drf.Serializer[Any]):
    """What a delivery did (``queuety.hooks.receive.Received``)."""

    delivery_id = drf.IntegerField()
    hook = drf.CharField()
    event_id = drf.CharField()
    outcome = drf.ChoiceField(choices=["started", "signalled", "failed"])
    run_id = drf.IntegerField(allow_null=True)
    replayed = drf.BooleanField()
    error = drf.CharField(allow_blank=True)


def _error(detail: str, code: str, http_status: int) -> Response:
    return Response({"detail": detail, "code": code}, status=http_status)


@extend_schema(
    request={"application/json": {"type": "object"}},
    parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH,
                                 description="The hook's name, as queuety.inbound() declared "
                                             "it.")],
    responses={
        202: OpenApiResponse(DeliverySerializer, description="A new delivery: stored, and "
                             "its run started or signal stored (no step has run yet)."),
        200: OpenApiResponse(DeliverySerializer, description="A retry of a stored delivery "
                             "(replayed), or a new one stored whose start or signal failed."),
        **{code: OpenApiResponse(ErrorSerializer, description=text) for code, text in (
            (400, "Signed, but not JSON or without a usable id; nothing stored."),
            (401, "The signature is missing, wrong or too old; nothing stored."),
            (404, "No hook is declared under this name; nothing stored."),
            (413, "The body is over QUEUETY['INBOUND_MAX_BYTES']; nothing stored."),
            (500, "The hook's secret function returned no secret (the site's setting is "
                  "missing); nothing stored."))}},
    auth=[],
)
class InboundHookView(APIView):
    """``POST hooks/<name>/``: a provider's delivery to inbound hook ``name``.

    202 for a new delivery (its run started, or its signal stored); 200 for a retry of one
    already stored (nothing new is done) and for a stored delivery whose start or signal was
    refused (its ``outcome`` is ``failed``, its ``error`` says why).
    """

    schema = AutoSchema()
    authentication_classes: list[Any] = []
    # A provider sends bursts from a few addresses; the site's anonymous throttle (keyed by
    # address) would refuse its deliveries. The signature is what keeps strangers out.
    throttle_classes: list[Any] = []

    def get_permissions(self) -> list[BasePermission]:
        return [AllowAny()]

    def post(self, request: Request, name: str) -> Response:
        try:
            hook = receive.find(name)
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            receive.check_size(name, declared)
            try:
                body = request.body
            except RequestDataTooBig:  # over the site's DATA_UPLOAD_MAX_MEMORY_SIZE
                return _error(f"The delivery to hook {name!r} is larger than this site "
                              "accepts (DATA_UPLOAD_MAX_MEMORY_SIZE). Nothing was stored.",
                              "payload_too_large", status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
            received = receive.receive(hook.name, request.headers, body)
        except receive.UnknownHook as error:
            return _error(str(error), "hook_not_found", status.HTTP_404_NOT_FOUND)
        except receive.BodyTooLarge as error:
            return _error(str(error), "payload_too_large",
                          status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        except exceptions.InvalidSignature as error:
            return _error(f"{error} Nothing was stored.", "invalid_signature",
                          status.HTTP_401_UNAUTHORIZED)
        except receive.MalformedDelivery as error:
            return _error(str(error), "malformed_delivery", status.HTTP_400_BAD_REQUEST)
        except verifiers.SecretUnavailable as error:
            logger.error("Inbound hook %r cannot verify deliveries: %s", name, error)
            return _error(f"Hook {name!r} cannot verify deliveries: {error} Nothing was "
                          "stored.", "hook_misconfigured",
                          status.HTTP_500_INTERNAL_SERVER_ERROR)
        fresh = not received.replayed and received.outcome != "failed"
        return Response(received.to_dict(),
                        status=status.HTTP_202_ACCEPTED if fresh else status.HTTP_200_OK)
