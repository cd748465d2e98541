from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Marketplace"

    def ready(self) -> None:
        from marketplace import url_ids

        url_ids.register()  # <id:…> in URL patterns: a row id the database can hold
        # Registers the API-key auth extension and the subscribers to lower rooms' signals.
        # Registers the launch, stop and destroy tasks with scheduler.work, and every task with
        # Celery, so every process (web included) can queue them by name (core.task_queue).
        from marketplace import tasks  # noqa: F401
        from marketplace.api import schema  # noqa: F401
        from marketplace.clusters import routes  # noqa: F401 - cluster hooks on the reconciler
        from marketplace.clusters import tasks as cluster_tasks  # noqa: F401
        from marketplace.deployments import tasks as deployment_tasks  # noqa: F401
        from marketplace.receivers import (  # noqa: F401
            accounts,
            billing,
            deployments,
            hosts,
            scheduler,
        )
