"""Rentals (what a team rented, on which terms, and its metering clocks), the renter's SSH keys,
and the offer read model that search runs on."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import F, Prefetch, Q
from django.db.models.functions import Upper
from django.utils import timezone


def rental_reference(instance_id: int) -> str:
    """What the ledger calls a rental (its hold, captures, invoice lines): ``rental:<id>``, with
    the id renters see in the console and the API (``/instances/<id>/``), which is the
    instance's. The hold is taken before the rental row exists, so the id cannot be the row's."""
    return f"rental:{instance_id}"


class Rental(models.Model):
    """A renter's right to ``gpu_count`` units of a machine until ``ends_at``.

    Metering reads two clocks: GPU time runs while the instance holds its GPUs and the machine
    is online; storage time runs from creation until expiry or destruction (stopped or not),
    also paused while the machine is offline. Each clock is ``seconds`` accumulated plus the
    time since ``…_since`` when it is running.

    Both clocks stop at ``ends_at``: the renter bought (and the hold covers) the time up to
    the end, and the expiry sweep that stops the container runs a little later. Storage is
    not charged during the data grace period either: the rental is over and cannot be
    restarted, so the kept data is a courtesy until it is deleted, not a service sold (and
    there is no hold left to capture it from). Extending before the end moves ``ends_at``,
    and the time up to the new end counts again.
    """

    team = models.ForeignKey("marketplace.Team", on_delete=models.CASCADE, related_name="rentals")
    provider_team = models.ForeignKey(
        "marketplace.Team", on_delete=models.PROTECT, related_name="provided_rentals"
    )
    machine = models.ForeignKey("hosts.Machine", on_delete=models.PROTECT, related_name="rentals")
    instance = models.OneToOneField(
        "scheduler.Instance", on_delete=models.PROTECT, related_name="rental"
    )
    gpu_count = models.PositiveSmallIntegerField()
    price_per_gpu_hour = models.BigIntegerField(help_text="micro-dollars, fixed at rental")
    storage_price_per_gb_month = models.BigIntegerField(help_text="micro-dollars")
    disk_gb = models.PositiveIntegerField()
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    hold_id = models.BigIntegerField(unique=True)
    gpu_seconds = models.BigIntegerField(default=0)
    # GPU-seconds banked at earlier GPU counts (a version that changed the count): the GPU
    # charge is price × (this + gpu_count × the clock's seconds), rounded once.
    gpu_unit_seconds = models.BigIntegerField(default=0)
    # What the rental owed at earlier rates (micro-dollars, banked when a bid changes, or a
    # version changes the disk): the charge is this plus the current terms' usage since.
    gpu_owed_banked = models.BigIntegerField(default=0)
    storage_owed_banked = models.BigIntegerField(default=0)
    # An interruptible rental: ``price_per_gpu_hour`` is the renter's bid. An on-demand rental
    # or a higher bid takes its GPUs (it stops, its data kept); ``interrupted_at`` is set
    # while it waits to win them back.
    interruptible = models.BooleanField(default=False)
    interrupted_at = models.DateTimeField(null=True, blank=True)
    gpu_clock_since = models.DateTimeField(null=True, blank=True)
    storage_seconds = models.BigIntegerField(default=0)
    storage_clock_since = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True, help_text="hold released")
    data_delete_after = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["settled_at", "ends_at"])]
        constraints = [
            models.CheckConstraint(condition=models.Q(gpu_count__gte=1), name="rental_gpus_min1"),
            models.CheckConstraint(
                condition=models.Q(ends_at__gt=models.F("starts_at")), name="rental_ends_after"
            ),
        ]

    def __str__(self) -> str:
        return f"rental {self.pk}"

    @property
    def reference(self) -> str:
        return rental_reference(self.instance_id)

    def billable_until(self, now: datetime) -> datetime:
        """The clocks' reading time: ``now``, but never past the end of the rental."""
        return min(now, self.ends_at)

    def gpu_seconds_at(self, now: datetime) -> int:
        return self.gpu_seconds + self._running_seconds(self.gpu_clock_since, now)

    def storage_seconds_at(self, now: datetime) -> int:
        return self.storage_seconds + self._running_seconds(self.storage_clock_since, now)

    def _running_seconds(self, since: datetime | None, now: datetime) -> int:
        if since is None:
            return 0
        return max(int((self.billable_until(now) - since).total_seconds()), 0)


class SshKey(models.Model):
    team = models.ForeignKey("marketplace.Team", on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=80)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=80)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "fingerprint"], name="sshkey_unique_per_team")
        ]

    def __str__(self) -> str:
        return self.name


RENTABLE = Q(rentable=True)


class Offer(models.Model):
    """A bundle of whole GPUs a renter can take on one listed, online machine, as vast.ai
    offers them: 8 free GPUs are offered as 1, 2, 4 and 8 (from the provider's minimum, and
    the free count itself when it is none of those), each with its own id and its figures
    (``dph_total`` is the bundle's price). Renting an offer takes exactly its ``num_gpus``.

    Each machine also has one ``all_free`` row: the bundle of all its free GPUs (none when
    all are taken), which carries its slices. Placement, the machine's pages and "only N
    free" read that row; search reads them all.

    A read model kept in step with machines and allocations (``offers_refresh``), so search is
    one indexed query over one table. Field names follow vast.ai's where they mean the same.
    """

    # Indexed by the (machine, num_gpus) constraint, which leads with it.
    machine = models.ForeignKey(
        "hosts.Machine", on_delete=models.CASCADE, related_name="offers", db_index=False
    )
    all_free = models.BooleanField(
        default=True, help_text="the bundle of all the machine's free GPUs (one per machine)"
    )
    provider_team = models.ForeignKey(
        "marketplace.Team", on_delete=models.CASCADE, related_name="+"
    )
    rentable = models.BooleanField(default=False, db_index=True)
    rented = models.BooleanField(
        default=False, help_text="some of the bundle's GPUs are rented now (it does not fit)"
    )
    gpu_name = models.CharField(max_length=120)
    num_gpus = models.PositiveSmallIntegerField(help_text="GPUs of this bundle")
    total_gpus = models.PositiveSmallIntegerField()
    min_gpus = models.PositiveSmallIntegerField(default=1)
    gpu_ram = models.FloatField(help_text="GB per GPU")
    cpu_cores_per_unit = models.FloatField()
    cpu_ram_per_unit = models.FloatField(help_text="GB")
    disk_per_unit = models.FloatField(help_text="GB")
    disk_enforced = models.BooleanField(
        default=False, help_text="the host caps a rental's disk at its size (storage quotas)"
    )
    price_per_gpu_hour = models.BigIntegerField(help_text="micro-dollars")
    dph_total = models.BigIntegerField(help_text="micro-dollars per hour for the bundle")
    storage_cost = models.BigIntegerField(help_text="micro-dollars per GB-month")
    reliability = models.FloatField()
    end_date = models.DateTimeField(
        null=True,
        blank=True,
        help_text="the end of the offer: the machine's end date or the start of its next "
        "maintenance window, whichever comes first",
    )
    geolocation = models.CharField(max_length=64, blank=True)
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_max_good = models.FloatField(default=0)
    verified = models.BooleanField(default=False)
    score = models.FloatField(default=0, db_index=True)
    # The machine's own figures, searched as vast.ai's fields of the same names.
    cpu_cores = models.PositiveIntegerField(default=0, help_text="the machine's CPU cores")
    datacenter = models.BooleanField(
        default=False, help_text="the provider is a certified datacenter (none is yet)"
    )
    static_ip = models.BooleanField(
        default=False, help_text="reached at a fixed IP address, not a host name"
    )
    direct_port_count = models.PositiveIntegerField(
        default=0, help_text="host ports the machine publishes rentals' ports from"
    )
    # Slices (fractional GPUs), on a machine that shares its cards: the most one slice can
    # take now, as a fraction of a card (the smaller of its compute and memory shares free on
    # the best card) and as compute percent and MB free on one card; each card's free share.
    sharing = models.BooleanField(default=False)
    gpu_frac = models.FloatField(default=0, help_text="largest free fraction of one card")
    slice_core_percent = models.PositiveSmallIntegerField(default=0)
    slice_memory_mb = models.PositiveIntegerField(default=0)
    min_slice_core_percent = models.PositiveSmallIntegerField(default=0)
    cards = models.JSONField(default=list, blank=True)
    # The bid market: the lowest bid per GPU-hour that rents the offer's GPUs interruptibly
    # (the machine's floor, or above the highest running bid on them); None where the machine
    # takes no bids.
    min_bid = models.BigIntegerField(null=True, blank=True, help_text="micro-dollars")
    # The machine's last passing benchmark (hosts.benchmark), for the offer's GPUs: per-GPU
    # figures × ``num_gpus``, and the score per dollar-hour of this offer's ``dph_total``.
    total_flops = models.FloatField(default=0, help_text="FP32 TFLOPS of the offer's GPUs")
    compute_cap = models.PositiveSmallIntegerField(default=0, help_text="e.g. 890 for 8.9")
    gpu_mem_bw = models.FloatField(default=0, help_text="GB/s of one GPU's memory")
    dlperf = models.FloatField(default=0, help_text="dlperf-style score of the offer's GPUs")
    dlperf_per_dphtotal = models.FloatField(default=0)
    inet_up = models.FloatField(default=0, help_text="Mbit/s out of the host")
    inet_down = models.FloatField(default=0, help_text="Mbit/s into the host")
    disk_bw = models.FloatField(default=0, help_text="MB/s read inside a rental's container")
    bench_simulated = models.BooleanField(default=False, help_text="GPU figures are simulated")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # Search filters rentable offers and sorts; these partial indexes let the common sorts
        # (and a GPU model or a region, matched case-insensitively) read rows in order and stop
        # at a page. The GPU-by-price index carries the GPUs after the price, so a GPU-count
        # filter (num_gpus>=4, whose cheapest offers all have fewer GPUs) is checked inside the
        # index instead of on each skipped row (bench/offer_search.py at a million offers;
        # figures in docs/benchmarks.md). Migration 0018 also keeps statistics on the upper-
        # cased GPU model and region: PostgreSQL keeps none for a partial index's expressions,
        # and its default guess, far too few rows for a GPU model, made it fetch thousands of
        # rows by bitmap and sort them instead of reading the index in order.
        # One bundle per size and machine, which the refresh upserts by. "One all_free row
        # per machine" is kept by the refresh, not by a constraint: a refresh moves the flag
        # from one row to another in one upsert, which a unique index would refuse midway.
        constraints = [
            models.UniqueConstraint(fields=["machine", "num_gpus"], name="offer_one_per_size"),
        ]
        indexes = [
            models.Index(F("score").desc(), "id", name="offer_by_score", condition=RENTABLE),
            models.Index(F("dph_total"), "id", name="offer_by_price", condition=RENTABLE),
            models.Index(
                F("dlperf_per_dphtotal").desc(),
                "id",
                name="offer_by_dlperf_per_dph",
                condition=RENTABLE,
            ),
            models.Index(
                F("reliability").desc(), "id", name="offer_by_reliability", condition=RENTABLE
            ),
            models.Index(
                Upper("gpu_name"), F("score").desc(), name="offer_gpu_by_score", condition=RENTABLE
            ),
            models.Index(
                Upper("gpu_name"),
                F("dph_total"),
                F("num_gpus"),
                name="offer_gpu_by_price_units",
                condition=RENTABLE,
            ),
            models.Index(
                Upper("geolocation"),
                F("score").desc(),
                "id",
                name="offer_region_by_score",
                condition=RENTABLE,
            ),
        ]

    def __str__(self) -> str:
        return f"offer {self.pk}: {self.num_gpus} GPUs of machine {self.machine_id}"


def all_free_offers(lookup: str = "offers") -> Prefetch:
    """Prefetches each machine's ``all_free`` offer (at ``lookup``, a path to a machine's
    offers) for ``machine_offer``, in one query for a whole list."""
    return Prefetch(lookup, queryset=Offer.objects.filter(all_free=True), to_attr="all_free_offers")


def machine_offer(machine) -> Offer | None:
    """The machine's offer of all its free GPUs: prefetched (``all_free_offers``) where the
    caller read a list, else read now."""
    found = getattr(machine, "all_free_offers", None)
    if found is None:
        return Offer.objects.filter(machine_id=machine.pk, all_free=True).first()
    return found[0] if found else None
