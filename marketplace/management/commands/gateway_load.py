"""Give the cluster gateway (Caddy, at GATEWAY_ADMIN) its whole config: the server on
``--listen`` and every cluster's route. Run once the gateway has started (``make run`` does);
after that the workers push route changes themselves."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from marketplace.clusters import routes
from scheduler import gateway


class Command(BaseCommand):
    help = "Load the cluster gateway's config (server and routes) over Caddy's admin API."

    def add_arguments(self, parser):
        parser.add_argument("--listen", default="127.0.0.1:8080", help="address:port it serves")

    def handle(self, *args, listen: str, **options):
        if not settings.GATEWAY_ADMIN:
            raise CommandError("GATEWAY_ADMIN is not set: where is the gateway's admin API?")
        admin = gateway.CaddyAdmin(settings.GATEWAY_ADMIN)
        try:
            admin.load(
                gateway.gateway_config(admin=settings.GATEWAY_ADMIN, listen=listen, routes=[])
            )
        except gateway.GatewayUnavailable as error:
            raise CommandError(f"the gateway did not take its config: {error}") from error
        routes.routes_push()
        self.stdout.write(f"gateway on {listen}, admin API on {settings.GATEWAY_ADMIN}")
