"""REST API for providers' payout requests: ``/api/v1/payouts/`` lists the team's requests
(newest first) and asks for a new one; the operator decides them in the admin.
``POST /api/v1/payouts/{id}/cancel/`` takes a waiting request back: its amount returns to the
unpaid earnings (a paid or rejected one answers 409, saying which).

Asking takes ``amount`` in dollars and cents and an optional ``idempotency_key`` (or the
``Idempotency-Key`` header): a retry with the same key answers 200 with the first request, and
writes nothing. Like the machines API, it needs the admin role: it sends the team's money out.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from billing import payouts
from billing.models import PayoutRequest
from marketplace.api.base import TeamScopedViewSet
from marketplace.api.fields import DollarsField
from marketplace.models import Role


class PayoutSerializer(serializers.ModelSerializer):
    amount = DollarsField(read_only=True, help_text="Dollars.")
    reason = serializers.CharField(read_only=True, help_text="Why it was rejected.")
    note = serializers.CharField(read_only=True, help_text="The payment's reference, when paid.")

    class Meta:
        model = PayoutRequest
        fields = ["id", "amount", "status", "reason", "note", "created_at", "decided_at"]


class PayoutCreateSerializer(serializers.Serializer):
    amount = DollarsField(
        max_decimals=2, help_text='Dollars and cents of your unpaid earnings, e.g. "120.50".'
    )
    idempotency_key = serializers.CharField(
        required=False, allow_blank=True, max_length=150, default=""
    )


class PayoutViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, TeamScopedViewSet
):
    """Payouts of the team's provider earnings: ask for one (the amount leaves the unpaid
    earnings at once and waits for the operator), see each one's status and, when rejected,
    why, or cancel one that waits. One request waits at a time; the minimum is a server
    setting."""

    base_queryset = PayoutRequest.objects.order_by("-created_at", "-pk")
    serializer_class = PayoutSerializer
    audience = "provider"
    required_role = Role.ADMIN

    @extend_schema(request=PayoutCreateSerializer, responses={201: PayoutSerializer})
    def create(self, request, *args, **kwargs):
        body = PayoutCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = body.validated_data["idempotency_key"] or request.headers.get("Idempotency-Key", "")
        payout, created = payouts.payout_request_create(
            team_id=self.team.pk,
            amount=body.validated_data["amount"],
            idempotency_key=key,
            requested_by_id=getattr(request.user, "pk", None),
        )
        return Response(
            PayoutSerializer(payout).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(request=None, responses={200: PayoutSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Take back a request that still waits: its amount goes back to the unpaid earnings.
        Cancelling it again answers the same; a paid or rejected request answers 409."""
        payout = payouts.payout_cancel(
            team_id=self.team.pk,
            payout_id=self.get_object().pk,
            cancelled_by_id=getattr(request.user, "pk", None),
        )
        return Response(PayoutSerializer(payout).data)
