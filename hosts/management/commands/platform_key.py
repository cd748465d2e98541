from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand

from hosts.keys import team_private_key, team_public_key


class Command(BaseCommand):
    help = (
        "Print a team's platform SSH key (the line its machines put in authorized_keys); "
        "--private-out also writes the private key, to log in by hand as the platform does."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("team_id", type=int)
        parser.add_argument("--private-out", metavar="PATH", default="")

    def handle(self, *args, team_id: int, private_out: str, **options) -> None:
        if private_out:
            path = Path(private_out)
            path.unlink(missing_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                team_private_key(team_id).write_private_key(handle)
        self.stdout.write(team_public_key(team_id))
