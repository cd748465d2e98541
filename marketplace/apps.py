from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Marketplace"

    def ready(self) -> None:
        # Registers the API-key auth extension and the subscribers to lower rooms' signals.
        from marketplace.api import schema  # noqa: F401
        from marketplace.receivers import accounts, billing, hosts, scheduler  # noqa: F401
