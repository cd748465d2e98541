"""REST API for the billing room. Amounts are dollars as decimal strings (``"99.768611"``),
as everywhere in the API; the ledger keeps integer micro-dollars inside.

Every viewset is a ``TeamScopedViewSet``: its queries go through the tenancy gateway, so
another team's ledger entry, hold or top-up answers 404 and lists hold only the team's rows.
"""

from __future__ import annotations

from datetime import datetime

import django_filters
from django.conf import settings
from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from billing import selectors, topups
from billing.errors import InvalidAmount
from billing.models import Account, ChargeUsage, Entry, Hold, TopUp, TransferKind
from marketplace.api.base import TeamScopedViewSet
from marketplace.api.fields import DOLLARS_SCHEMA, DollarsField, UtcDateTimeFilter, dollars

USD = "Dollars."


class BalanceSerializer(serializers.Serializer):
    available = DollarsField(help_text=USD)
    held = DollarsField(help_text=USD)
    earnings = DollarsField(help_text=USD + " Unpaid provider earnings.")


class BalanceViewSet(TeamScopedViewSet):
    """The acting team's credit: available, held by running rentals, and provider earnings."""

    pagination_class = None  # one object (or a short list by month), not pages
    base_queryset = Account.objects.all()
    serializer_class = BalanceSerializer

    def list(self, request):
        accounts = self.get_queryset()
        balance = selectors.balance_from_accounts(accounts)
        earnings = accounts.filter(kind="earnings").values_list("balance", flat=True).first()
        return Response(
            BalanceSerializer(
                {"available": balance.available, "held": balance.held, "earnings": earnings or 0}
            ).data
        )


class EntrySerializer(serializers.ModelSerializer):
    transfer_id = serializers.IntegerField(read_only=True)
    kind = serializers.ChoiceField(
        source="transfer.kind", choices=TransferKind.choices, read_only=True
    )
    reference = serializers.CharField(source="transfer.reference", read_only=True)
    description = serializers.CharField(source="transfer.description", read_only=True)
    usage_kind = serializers.ChoiceField(
        source="transfer.usage_kind",
        choices=[("", "Not a usage charge"), *ChargeUsage.choices],
        read_only=True,
        help_text='What a usage charge ("capture") charges for: "gpu", "storage", or'
        ' "gpu+storage" (the metering sweep charges both at once; gpu_amount and'
        " storage_amount split it). Empty for other kinds.",
    )
    gpu_amount = serializers.SerializerMethodField(
        help_text=USD + " The GPU time part of a usage charge's gross amount (what the renter"
        " paid, platform fee included); null for other kinds."
    )
    storage_amount = serializers.SerializerMethodField(
        help_text=USD + " The storage part of a usage charge's gross amount; null for other"
        " kinds. gpu_amount + storage_amount is the charge's gross amount."
    )
    account = serializers.CharField(source="account_kind", read_only=True)
    amount = DollarsField(
        read_only=True, help_text=USD + " This account's change (negative: money out)."
    )
    balance_after = DollarsField(read_only=True, help_text=USD + " The account's balance after it.")

    class Meta:
        model = Entry
        fields = [
            "id", "created_at", "transfer_id", "kind", "reference", "description", "usage_kind",
            "account", "amount", "gpu_amount", "storage_amount", "balance_after",
        ]  # fmt: skip

    @extend_schema_field({**DOLLARS_SCHEMA, "nullable": True})
    def get_gpu_amount(self, entry: Entry) -> str | None:
        split = entry.transfer.usage_split
        return None if split is None else dollars(split[0])

    @extend_schema_field({**DOLLARS_SCHEMA, "nullable": True})
    def get_storage_amount(self, entry: Entry) -> str | None:
        split = entry.transfer.usage_split
        return None if split is None else dollars(split[1])


class EntryFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(field_name="transfer__kind", choices=TransferKind.choices)
    reference = django_filters.CharFilter(field_name="transfer__reference", lookup_expr="icontains")
    created_after = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Entry
        fields = ["kind", "reference", "created_after", "created_before"]


class LedgerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The team's ledger entries, newest first. Filter by kind, reference, time."""

    base_queryset = Entry.objects.select_related("transfer").order_by("-created_at", "-id")
    serializer_class = EntrySerializer
    filterset_class = EntryFilter


class HoldSerializer(serializers.ModelSerializer):
    amount = DollarsField(read_only=True, help_text=USD + " Held in all.")
    captured_gpu = DollarsField(read_only=True, help_text=USD)
    captured_storage = DollarsField(read_only=True, help_text=USD)
    captured = DollarsField(read_only=True, help_text=USD)
    released = DollarsField(read_only=True, help_text=USD)
    remaining = DollarsField(read_only=True, help_text=USD)

    class Meta:
        model = Hold
        fields = [
            "id", "reference", "machine_reference", "description", "status", "amount",
            "captured_gpu", "captured_storage", "captured", "released", "remaining",
            "created_at", "closed_at",
        ]  # fmt: skip


class HoldViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Credit held for the team's rentals."""

    base_queryset = Hold.objects.order_by("-created_at")
    serializer_class = HoldSerializer
    filterset_fields = ["status", "reference"]
    audience = "renter"


class TopUpSerializer(serializers.ModelSerializer):
    amount = DollarsField(read_only=True, help_text=USD + " Credit the top-up adds.")
    amount_paid = DollarsField(read_only=True, help_text=USD + " What the payer paid.")

    class Meta:
        model = TopUp
        fields = [
            "id", "amount", "amount_paid", "status", "checkout_url", "failure_reason",
            "created_at", "credited_at",
        ]  # fmt: skip


class TopUpCreateSerializer(serializers.Serializer):
    amount_usd = DollarsField(max_decimals=2, help_text='Dollars and cents, e.g. "25.00".')
    success_url = serializers.URLField()
    cancel_url = serializers.URLField()

    def validate_amount_usd(self, amount: int) -> int:
        try:
            topups.topup_validate_amount(amount)
        except InvalidAmount as error:
            raise serializers.ValidationError(str(error)) from error
        return amount


class TopUpViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, TeamScopedViewSet
):
    """Card top-ups through Stripe Checkout: create one, send the payer to ``checkout_url``;
    the credit arrives with Stripe's webhook (poll the top-up or the balance)."""

    base_queryset = TopUp.objects.order_by("-created_at")
    serializer_class = TopUpSerializer
    audience = "renter"

    @extend_schema(request=TopUpCreateSerializer, responses={201: TopUpSerializer})
    def create(self, request, *args, **kwargs):
        body = TopUpCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user_id = getattr(request.user, "pk", None)
        topup = topups.topup_checkout_start(
            team_id=self.team.pk,
            amount=body.validated_data["amount_usd"],
            success_url=body.validated_data["success_url"],
            cancel_url=body.validated_data["cancel_url"],
            created_by_id=user_id,
        )
        return Response(TopUpSerializer(topup).data, status=status.HTTP_201_CREATED)


class InvoiceLineSerializer(serializers.Serializer):
    reference = serializers.CharField()
    usage_kind = serializers.CharField(help_text='"gpu", "storage", or "" (other charges).')
    amount = DollarsField(help_text=USD)
    charges = serializers.IntegerField(
        help_text="Usage charges that charged this kind. A charge covering GPU time and storage"
        " counts on both of its lines; the invoice's charges count it once."
    )


class InvoiceSerializer(serializers.Serializer):
    month = serializers.CharField(help_text="YYYY-MM")
    total = DollarsField(help_text=USD)
    charges = serializers.IntegerField(
        required=False, help_text="Usage charges in the month, each counted once."
    )
    lines = InvoiceLineSerializer(many=True, required=False)
    credit_added = DollarsField(required=False, help_text=USD)


class InvoiceViewSet(TeamScopedViewSet):
    """Monthly invoices: one line per rental reference per usage kind."""

    pagination_class = None  # one object (or a short list by month), not pages
    base_queryset = Entry.objects.all()
    serializer_class = InvoiceSerializer
    lookup_field = "month"
    lookup_value_regex = r"\d{4}-\d{2}"
    audience = "renter"

    def list(self, request):
        months = selectors.invoice_months(self.get_queryset())
        return Response(
            InvoiceSerializer(
                [{"month": f"{m:%Y-%m}", "total": total} for m, total in months], many=True
            ).data
        )

    def retrieve(self, request, month: str):
        try:
            first = datetime.strptime(month, "%Y-%m").date()
        except ValueError as error:
            raise Http404 from error
        invoice = selectors.invoice_for_month(self.get_queryset(), first)
        if not invoice.lines and not invoice.credit_added:
            raise Http404
        return Response(
            InvoiceSerializer(
                {
                    "month": month,
                    "total": invoice.total,
                    "charges": invoice.charges,
                    "credit_added": invoice.credit_added,
                    "lines": [
                        {
                            "reference": line.reference,
                            "usage_kind": line.usage_kind,
                            "amount": line.amount,
                            "charges": line.charges,
                        }
                        for line in invoice.lines
                    ],
                }
            ).data
        )


class EarningsRowSerializer(serializers.Serializer):
    gross = DollarsField(help_text=USD + " What renters were charged.")
    fee = DollarsField(help_text=USD + " The platform fee within gross.")
    net = DollarsField(help_text=USD + " The provider's earnings.")


class MachineEarningsSerializer(EarningsRowSerializer):
    machine_reference = serializers.CharField()


class DayEarningsSerializer(EarningsRowSerializer):
    day = serializers.DateField()


class EarningsSerializer(serializers.Serializer):
    fee_percent = serializers.CharField()
    by_machine = MachineEarningsSerializer(many=True)
    by_day = DayEarningsSerializer(many=True)


class EarningsViewSet(TeamScopedViewSet):
    """Provider earnings per machine reference and per day; the platform fee separately."""

    pagination_class = None  # one object (or a short list by month), not pages
    base_queryset = Entry.objects.all()
    serializer_class = EarningsSerializer
    audience = "provider"

    def list(self, request):
        entries = self.get_queryset()

        def rows(found, key):
            return [{key: str(r.key), "gross": r.gross, "fee": r.fee, "net": r.net} for r in found]

        return Response(
            EarningsSerializer(
                {
                    "fee_percent": str(settings.PLATFORM_FEE_PERCENT),
                    "by_machine": rows(selectors.earnings_by_machine(entries), "machine_reference"),
                    "by_day": rows(selectors.earnings_by_day(entries), "day"),
                }
            ).data
        )


router = SimpleRouter()
router.register("billing/balance", BalanceViewSet, basename="billing-balance")
router.register("billing/ledger", LedgerViewSet, basename="billing-ledger")
router.register("billing/holds", HoldViewSet, basename="billing-hold")
router.register("billing/topups", TopUpViewSet, basename="billing-topup")
router.register("billing/invoices", InvoiceViewSet, basename="billing-invoice")
router.register("billing/earnings", EarningsViewSet, basename="billing-earnings")
urlpatterns: list = [*router.urls]
