"""A whole installation on one machine, started from the production recipe's own units.

``make cluster-demo`` and the system tests use it: N web processes behind Caddy (TLS from
Caddy's own CA for ``localhost``), M Celery workers, one beat, against a PostgreSQL and a
Redis of its own (``Postgres``/``Redis`` below start private servers on their own ports, in a
scratch folder, so stopping or restarting them touches nobody else's). Every process is
started from its unit's ``ExecStart=`` with the environment file's values (deploy/recipe.py).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from deploy.recipe import (
    CADDY_DROP_IN,
    CADDYFILE,
    ENV_EXAMPLE,
    Process,
    Recipe,
    Unit,
    command_line,
    env_file_parse,
    env_file_write,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[1]
# The newest PostgreSQL server Debian installed (15 on Debian 12).
PG_BIN = max(
    Path("/usr/lib/postgresql").glob("*/bin"),
    key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
    default=Path("/usr/lib/postgresql/15/bin"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


@dataclass
class Redis:
    """A private redis-server (no persistence) on its own port."""

    folder: Path
    port: int = field(default_factory=free_port)
    # Keep data across a stop and start (an append-only file), as a production Redis should:
    # queued tasks survive a restart.
    persistent: bool = True
    popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Redis:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.popen = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.persistent else "no", "--appendfsync", "always",
             "--dir", str(self.folder), "--maxclients", "10000"],
            stdout=(self.folder / "redis.log").open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        wait_for(lambda: port_open(self.port), timeout=10, what=f"redis on {self.port}")
        return self

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            self.popen.wait(timeout=10)


@dataclass
class Postgres:
    """A private PostgreSQL cluster (initdb into a fresh folder under /tmp) on its own port,
    run as the ``postgres`` user when started by root (PostgreSQL refuses to run as root, and
    that user cannot enter pytest's private temporary folders)."""

    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpumkt-pg-")))
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"postgres://gpumkt:gpumkt@127.0.0.1:{self.port}/gpumkt"

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def _as_owner(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)

    def _check(self, done: subprocess.CompletedProcess, what: str) -> None:
        if done.returncode != 0:
            raise RuntimeError(f"{what}: {done.stdout} {done.stderr}")

    def start(self) -> Postgres:
        if not self.data.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                owner = pwd.getpwnam("postgres")
                os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            password = self.folder / "pw"
            password.write_text("gpumkt\n")
            if os.geteuid() == 0:
                os.chown(password, owner.pw_uid, owner.pw_gid)
            self._check(
                self._as_owner(
                    [str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "gpumkt",
                     f"--pwfile={password}", "-A", "scram-sha-256", "--no-sync", "-E", "UTF8"]
                ),
                "initdb",
            )  # fmt: skip
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(
                    f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.folder}'\nmax_connections = 300\n"
                    "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                )
            self._pg_ctl("start")
            done = subprocess.run(
                ["psql", self.url.rsplit("/", 1)[0] + "/postgres", "-qc", "CREATE DATABASE gpumkt"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            self._check(done, "create database")
        else:
            self._pg_ctl("start")
        return self

    def _pg_ctl(self, action: str, *extra: str) -> None:
        argv = [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "pg.log")]
        self._check(self._as_owner([*argv, "-w", "-t", "60", *extra, action]), f"pg_ctl {action}")

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("stop", "-m", mode)

    def remove(self) -> None:
        """Stop it and delete its files."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def restart(self) -> None:
        self._pg_ctl("restart", "-m", "fast")


def caddy_process(recipe: Recipe) -> Process:
    """Caddy as Debian's caddy.service runs it with our drop-in: the drop-in's command line
    and environment file, the Caddyfile and storage in the scratch folder."""
    caddyfile = recipe.scratch / "Caddyfile"
    shutil.copyfile(CADDYFILE, caddyfile)
    drop_in = Unit.parse("gpumkt.conf", CADDY_DROP_IN.read_text())
    command = [line for line in drop_in.values("ExecStart") if line][-1]
    argv = [
        str(caddyfile) if word == "/etc/caddy/Caddyfile" else word
        for word in command_line(command, instance="", env={})
    ]
    argv[0] = shutil.which("caddy") or argv[0]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(recipe.scratch),
        "XDG_DATA_HOME": str(recipe.scratch / "caddy-data"),
        "XDG_CONFIG_HOME": str(recipe.scratch / "caddy-config"),
        **recipe.environment(),
    }
    return Process(
        name="caddy.service",
        kind="notify",
        starts=[argv],
        after_start=[],
        env=env,
        cwd=recipe.scratch,
        log=recipe.scratch / "logs" / "caddy.service.log",
    )


class LocalCluster:
    """The recipe's processes on this machine. ``web_ports`` and ``worker_ports`` name the
    unit instances (``gpumkt-web@8001`` …); ``overrides`` go into the environment file."""

    def __init__(
        self,
        scratch: Path,
        *,
        database_url: str,
        redis_url: str,
        webs: int = 2,
        workers: int = 3,
        worker_concurrency: int = 2,
        overrides: dict[str, str] | None = None,
    ):
        self.scratch = scratch
        self.recipe = Recipe(root=ROOT, scratch=scratch)
        self.web_ports = [free_port() for _ in range(webs)]
        self.worker_ports = [free_port() for _ in range(workers)]
        self.https_port = free_port()
        auth_upstream = f"127.0.0.1:{self.web_ports[0]}" if webs else ""
        env = env_file_parse(ENV_EXAMPLE.read_text())
        env.update(
            {
                "SECRET_KEY": secrets.token_urlsafe(50),
                "ALLOWED_HOSTS": "localhost",
                "CSRF_TRUSTED_ORIGINS": f"https://localhost:{self.https_port}",
                "DATABASE_URL": database_url,
                "REDIS_URL": redis_url,
                "WORKER_CONCURRENCY": str(worker_concurrency),
                "GPUMKT_DOMAIN": "localhost",
                "GPUMKT_UPSTREAMS": " ".join(f"127.0.0.1:{port}" for port in self.web_ports),
                "GPUMKT_HTTPS_PORT": str(self.https_port),
                "GATEWAY_URL": f"https://localhost:{self.https_port}",
                "GATEWAY_AUTH_UPSTREAM": auth_upstream,
                "GPUMKT_HTTP_PORT": str(free_port()),
                "GATEWAY_ADMIN": f"localhost:{free_port()}",
                "GATEWAY_LISTEN": f"127.0.0.1:{free_port()}",
                "METRICS_TOKEN": secrets.token_urlsafe(16),
                "PYTHONPATH": str(ROOT),
                **(overrides or {}),
            }
        )
        scratch.mkdir(parents=True, exist_ok=True)
        env_file_write(self.recipe.env_path, env)
        self.env = env
        self.webs: list[Process] = []
        self.workers: list[Process] = []
        self.beat: Process | None = None
        self.caddy: Process | None = None

    # --- starting and stopping --------------------------------------------------------------
    def release(self) -> None:
        self.recipe.process("gpumkt-release.service").start()

    def start_web(self, port: int) -> Process:
        process = self.recipe.process("gpumkt-web@.service", str(port)).start()
        self.webs.append(process)
        return process

    def start_worker(self, port: int) -> Process:
        process = self.recipe.process("gpumkt-worker@.service", str(port)).start()
        self.workers.append(process)
        return process

    def start(self, *, caddy: bool = True) -> LocalCluster:
        """Start everything, or stop what did start and raise."""
        try:
            return self._start(caddy=caddy)
        except BaseException:
            self.stop()
            raise

    def _start(self, *, caddy: bool) -> LocalCluster:
        self.release()
        for port in self.web_ports:
            self.start_web(port)
        for port in self.worker_ports:
            self.start_worker(port)
        self.beat = self.recipe.process("gpumkt-beat.service").start()
        if caddy:
            self.caddy = caddy_process(self.recipe).start()
            wait_for(lambda: self.front_ok("/healthz"), timeout=30, what="Caddy in front")
        for port in self.worker_ports:
            wait_for(lambda port=port: self.worker_answers(port), timeout=60, what=f"worker{port}")
        return self

    def processes(self) -> list[Process]:
        return [p for p in [self.caddy, *self.webs, *self.workers, self.beat] if p is not None]

    def stop(self) -> None:
        for process in self.processes():
            try:
                process.stop(timeout=20)
            except Exception:  # stop the rest whatever one does
                process.kill(signal.SIGKILL)

    # --- asking the processes -----------------------------------------------------------------
    @property
    def front(self) -> str:
        return f"https://localhost:{self.https_port}"

    def tls_context(self) -> ssl.SSLContext:
        """Trusts Caddy's own CA (the one it made for ``localhost``) and nothing else."""
        root = self.scratch / "caddy-data" / "caddy" / "pki" / "authorities" / "local" / "root.crt"
        return ssl.create_default_context(cafile=str(root))

    def get(self, url: str, *, headers: dict[str, str] | None = None, timeout: float = 10):
        """(status, body as text) of a GET; TLS checked against Caddy's CA."""
        headers = {"Host": "localhost", **(headers or {})}
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 (our own URLs)
        context = self.tls_context() if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # noqa: S310
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def api(self, method: str, path: str, key: str, body: dict | None = None, *, web=None):
        """(status, JSON) of an API call through Caddy (TLS), or straight to web process
        number ``web`` with the headers Caddy would add."""
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        if web is None:
            url, context = self.front + "/api/v1" + path, self.tls_context()
        else:
            url = f"http://127.0.0.1:{self.web_ports[web]}/api/v1{path}"
            context = None
            headers |= {"Host": "localhost", "X-Forwarded-Proto": "https"}
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, method=method, data=data, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=60, context=context) as response:  # noqa: S310
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def direct(self, port: int, path: str) -> tuple[int, str]:
        return self.get(f"http://127.0.0.1:{port}{path}")

    def front_ok(self, path: str) -> bool:
        try:
            return self.get(self.front + path)[0] == 200
        except (OSError, ssl.SSLError):
            return False

    def celery(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        env = self.recipe.process("gpumkt-beat.service").env
        return subprocess.run(
            [str(ROOT / ".venv" / "bin" / "celery"), "-A", "marketplace", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def worker_answers(self, port: int) -> bool:
        node = f"worker{port}@{socket.gethostname()}"
        done = self.celery("inspect", "ping", "-d", node, "--timeout", "2", "--json")
        if done.returncode != 0:
            return False
        try:
            replies = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return False
        return node in replies

    def manage(self, *args: str, timeout: float = 300) -> str:
        env = self.recipe.process("gpumkt-beat.service").env
        done = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "python"), "manage.py", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}: {done.stdout} {done.stderr}")
        return done.stdout
