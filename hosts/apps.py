from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "hosts"

    def ready(self) -> None:
        from hosts import services, ssh

        # Whatever room meets a changed host key first, the machine is flagged at once.
        if services.flag_key_mismatch_handler not in ssh.key_mismatch_handlers:
            ssh.key_mismatch_handlers.append(services.flag_key_mismatch_handler)
