"""Names for what the ledger refers to by id: ``rental:<instance id>`` and ``machine:<id>``.

Billing imports no other app, so its rows carry references; the pages people read turn them
into names here (the API and the CSV export keep the references). Each lookup is scoped to
the team reading: a reference to another team's rental or machine keeps its reference.

The other way round, ``references_named`` turns what a person types into the ledger's
Reference filter (a name the page shows) into the references of the team's own rentals and
machines that bear it, as subqueries the ledger's query takes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import (
    Case,
    CharField,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Cast, Concat

from hosts.models import Gpu, Machine
from marketplace.models import Rental, Team
from marketplace.tenancy import team_objects

RENTAL_PREFIX = "rental:"
MACHINE_PREFIX = "machine:"


def _ids(references: Iterable[str], prefix: str) -> set[int]:
    found = set()
    for reference in references:
        tail = reference[len(prefix) :] if reference.startswith(prefix) else ""
        if tail.isdigit():
            found.add(int(tail))
    return found


@dataclass(frozen=True)
class RentalName:
    """What a person calls a rental: its label or image, its GPUs and machine, its rate."""

    instance_id: int
    name: str  # the renter's label, else the image
    gpu_model: str
    gpu_count: int
    machine_name: str
    price_per_gpu_hour: int  # micro-dollars, the current terms

    @property
    def gpus(self) -> str:
        return f"{self.gpu_count}× {self.gpu_model}" if self.gpu_model else f"{self.gpu_count} GPU"

    def __str__(self) -> str:
        return self.name


def _gpu_models(machine_ids: set[int]) -> dict[int, str]:
    """Each machine's GPU model (the first card's; machines list one model)."""
    models: dict[int, str] = {}
    for machine_id, name in (
        Gpu.objects.filter(machine_id__in=machine_ids)
        .order_by("machine_id", "index")
        .values_list("machine_id", "name")
    ):
        models.setdefault(machine_id, name)
    return models


def rental_names(team: Team, references: Iterable[str]) -> dict[str, RentalName]:
    """The team's own rentals among ``references``, by reference, in two queries."""
    ids = _ids(references, RENTAL_PREFIX)
    if not ids:
        return {}
    rentals = list(
        Rental.objects.filter(team=team, instance_id__in=ids).select_related("instance", "machine")
    )
    models = _gpu_models({rental.machine_id for rental in rentals})
    return {
        rental.reference: RentalName(
            instance_id=rental.instance_id,
            name=rental.instance.label or rental.instance.image,
            gpu_model=models.get(rental.machine_id, ""),
            gpu_count=rental.gpu_count,
            machine_name=rental.machine.name,
            price_per_gpu_hour=rental.price_per_gpu_hour,
        )
        for rental in rentals
    }


def machine_names(team: Team, references: Iterable[str]) -> dict[str, str]:
    """The team's own machines among ``references``: reference → the machine's name."""
    ids = _ids(references, MACHINE_PREFIX)
    if not ids:
        return {}
    return {
        f"{MACHINE_PREFIX}{pk}": name
        for pk, name in Machine.objects.filter(team=team, pk__in=ids).values_list("pk", "name")
    }


@dataclass(frozen=True)
class NamedReferences:
    """The team's own rentals and machines whose shown names contain a text: subqueries of
    ``rental:<id>`` (a transfer's reference) and ``machine:<id>`` (its machine reference)."""

    rentals: QuerySet
    machines: QuerySet


def references_named(team: Team, text: str) -> NamedReferences:
    """What ``text`` names among the team's own objects, matched (ignoring case) against what
    the pages show: a rental's name (its label, else its image) and its "2× GPU-model on
    machine-name" line, and a machine's name."""
    first_gpu = Gpu.objects.filter(machine_id=OuterRef("machine_id")).order_by("index")
    text_field = CharField()
    count = Cast("gpu_count", text_field)
    rentals = (
        team_objects(team, Rental.objects.all())
        .annotate(gpu_model=Subquery(first_gpu.values("name")[:1]))
        .annotate(
            # As RentalName shows them: its name, and its GPUs on its machine.
            shown_name=Case(
                When(instance__label="", then=F("instance__image")),
                default=F("instance__label"),
                output_field=text_field,
            ),
            shown_gpus=Case(
                When(
                    Q(gpu_model__isnull=True) | Q(gpu_model=""),
                    then=Concat(count, Value(" GPU on "), "machine__name", output_field=text_field),
                ),
                default=Concat(
                    count,
                    Value("× "),
                    "gpu_model",
                    Value(" on "),
                    "machine__name",
                    output_field=text_field,
                ),
            ),  # fmt: skip
        )
        .filter(Q(shown_name__icontains=text) | Q(shown_gpus__icontains=text))
        .annotate(ref=Concat(Value(RENTAL_PREFIX), Cast("instance_id", text_field)))
        .values("ref")
    )
    machines = (
        team_objects(team, Machine.objects.filter(name__icontains=text))
        .annotate(ref=Concat(Value(MACHINE_PREFIX), Cast("pk", text_field)))
        .values("ref")
    )
    return NamedReferences(rentals=rentals, machines=machines)
