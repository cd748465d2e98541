"""Renting, as deployments/ and clusters/ are packages for theirs: placing an order on a
machine's free capacity (renting), its terms, bids, clocks and metering, versions, volumes and
what a renter does to a running rental (actions)."""
