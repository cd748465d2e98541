from __future__ import annotations

from django.core.management.base import BaseCommand

from hosts.keys import platform_public_key


class Command(BaseCommand):
    help = "Print the platform's public SSH key (made on first use)."

    def handle(self, *args, **options) -> None:
        self.stdout.write(platform_public_key())
