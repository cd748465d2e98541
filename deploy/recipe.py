"""The production recipe read as data: its systemd units, environment file and Caddyfile.

The tests and ``make cluster-demo`` start processes from the very command lines the units
hold (``ExecStart=``, ``Environment=``, ``WorkingDirectory=``, with systemd's ``%i``/``%H``
specifiers and ``${VAR}``/``$VAR`` expansion), with the environment file's values, so what
they prove is what production runs. Nothing here is imported by the marketplace itself.

Paths in the units are the installed ones (``/opt/gpumkt``, ``/etc/gpumkt/gpumkt.env``,
``/var/lib/gpumkt``, ``/run``); ``Recipe.rendered`` maps them onto a checkout and a scratch
folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DEPLOY_DIR = Path(__file__).resolve().parent
UNITS_DIR = DEPLOY_DIR / "systemd"
ENV_EXAMPLE = DEPLOY_DIR / "gpumkt.env.example"
CADDYFILE = DEPLOY_DIR / "Caddyfile"
CADDY_DROP_IN = UNITS_DIR / "caddy.service.d" / "gpumkt.conf"

INSTALL_DIR = "/opt/gpumkt"
ENV_FILE = "/etc/gpumkt/gpumkt.env"
STATE_DIR = "/var/lib/gpumkt"
RUN_DIR = "/run"

UNITS = (
    "gpumkt.target",
    "gpumkt-release.service",
    "gpumkt-web@.service",
    "gpumkt-worker@.service",
    "gpumkt-beat.service",
)


def env_file_parse(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= syntax, the part we use: ``KEY=value`` lines, ``#``
    comments, optional surrounding quotes."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"line {number}: not KEY=value: {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def env_file_write(path: Path, values: dict[str, str]) -> None:
    lines = []
    for key, value in values.items():
        if "\n" in value:
            raise ValueError(f"{key}: a value may not span lines")
        lines.append(f"{key}={value}")
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)


@dataclass
class Unit:
    """One unit file: its settings by section, repeated keys in order."""

    name: str
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, name: str, text: str) -> Unit:
        unit, section = cls(name), None
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                unit.sections.setdefault(section, [])
                continue
            key, sep, value = line.partition("=")
            if section is None or not sep:
                raise ValueError(f"{name} line {number}: not a setting: {raw!r}")
            unit.sections[section].append((key.strip(), value.strip()))
        return unit

    def values(self, key: str, section: str = "Service") -> list[str]:
        return [value for k, value in self.sections.get(section, []) if k == key]

    def value(self, key: str, section: str = "Service", default: str = "") -> str:
        found = self.values(key, section)
        return found[-1] if found else default


def specifiers(text: str, instance: str) -> str:
    """systemd's specifiers that our units use: %i (instance), %H (host name), %%."""
    table = {"i": instance, "H": socket.gethostname(), "%": "%"}

    def replace(match: re.Match[str]) -> str:
        letter = match.group(1)
        if letter not in table:
            raise ValueError(f"unsupported specifier %{letter} in {text!r}")
        return table[letter]

    return re.sub(r"%(.)", replace, text)


def command_line(text: str, *, instance: str, env: dict[str, str]) -> list[str]:
    """An Exec*= line as systemd runs it: specifiers, then words (shell-like quoting), then
    ``${VAR}`` as one word and ``$VAR`` split on white space. The ``-@:+!`` prefixes of the
    program are dropped (we run it the same way)."""
    words = shlex.split(specifiers(text, instance))
    argv: list[str] = []
    for word in words:
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            argv.extend(env.get(whole.group(1), "").split())
            continue
        argv.append(
            re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word)
        )
    if argv:
        argv[0] = argv[0].lstrip("-@:+!")
    return argv


def env_assignments(text: str, instance: str) -> dict[str, str]:
    """An ``Environment=`` line: one or more ``KEY=value`` words."""
    return dict(word.split("=", 1) for word in shlex.split(specifiers(text, instance)))


@dataclass
class Recipe:
    """The recipe's units with installed paths mapped onto ``root`` (a checkout) and
    ``scratch`` (where the environment file, state and runtime folders go)."""

    root: Path
    scratch: Path

    @property
    def env_path(self) -> Path:
        return self.scratch / "gpumkt.env"

    @property
    def units_dir(self) -> Path:
        return self.scratch / "units"

    def rewrite(self, text: str) -> str:
        return (
            text.replace(ENV_FILE, str(self.env_path))
            .replace(INSTALL_DIR, str(self.root))
            .replace(STATE_DIR, str(self.scratch / "state"))
            .replace(f"{RUN_DIR}/", f"{self.scratch / 'run'}/")
        )

    def rendered(self) -> list[Path]:
        """The unit files with their paths mapped, written to ``units_dir``."""
        self.units_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in UNITS:
            path = self.units_dir / name
            path.write_text(self.rewrite((UNITS_DIR / name).read_text()))
            paths.append(path)
        return paths

    def unit(self, name: str) -> Unit:
        return Unit.parse(name, self.rewrite((UNITS_DIR / name).read_text()))

    def environment(self) -> dict[str, str]:
        return env_file_parse(self.env_path.read_text())

    def process(self, name: str, instance: str = "") -> Process:
        """How to run unit ``name`` (e.g. ``gpumkt-web@.service`` with instance ``8001``)."""
        unit = self.unit(name)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.scratch)}
        env.update(self.environment())
        for line in unit.values("Environment"):
            env.update(env_assignments(line, instance))
        for folder in unit.values("RuntimeDirectory"):
            (self.scratch / "run" / specifiers(folder, instance)).mkdir(parents=True, exist_ok=True)
        (self.scratch / "state").mkdir(parents=True, exist_ok=True)
        return Process(
            name=name.replace("@.", f"@{instance}.") if instance else name,
            kind=unit.value("Type", default="simple"),
            starts=[
                command_line(line, instance=instance, env=env) for line in unit.values("ExecStart")
            ],
            after_start=[
                command_line(line, instance=instance, env=env)
                for line in unit.values("ExecStartPost")
            ],
            env=env,
            cwd=Path(unit.value("WorkingDirectory", default=str(self.root))),
            log=self.scratch / "logs" / f"{name.replace('@.', f'@{instance}.')}.log",
            kill_mode=unit.value("KillMode", default="control-group"),
        )


@dataclass
class Process:
    """One unit's process(es), started as systemd would start them (without its sandbox)."""

    name: str
    kind: str
    starts: list[list[str]]
    after_start: list[list[str]]
    env: dict[str, str]
    cwd: Path
    log: Path
    kill_mode: str = "control-group"  # the unit's KillMode=, as systemd's stop reads it
    popen: subprocess.Popen | None = None

    def start(self, *, timeout: float = 300) -> Process:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if self.kind == "oneshot":
            with self.log.open("ab") as out:
                for argv in self.starts:
                    done = subprocess.run(
                        argv, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                        timeout=timeout,
                    )  # fmt: skip
                    if done.returncode != 0:
                        raise RuntimeError(
                            f"{self.name}: {argv} exited {done.returncode}: {self.tail()}"
                        )
            return self
        (argv,) = self.starts  # a long-running unit has one ExecStart
        self.popen = subprocess.Popen(
            argv, cwd=self.cwd, env=self.env, stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        for post in self.after_start:
            done = subprocess.run(
                post, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout
            )
            if done.returncode != 0:
                self.stop()
                raise RuntimeError(f"{self.name}: {post} failed: {done.stderr} {self.tail()}")
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 30) -> int | None:
        """Stop as systemd does for the unit's ``KillMode=``: SIGTERM to the whole process
        group (``control-group``), or to the main process only (``mixed``: a Celery worker
        then finishes its running tasks and stops its own pool); SIGKILL to what is left of
        the group after ``timeout``, or once the main process has exited."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            try:
                if self.kill_mode == "mixed":
                    self.popen.send_signal(signal.SIGTERM)
                else:
                    os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout=timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        return self.popen.returncode

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def wait_for(predicate, *, timeout: float, interval: float = 0.2, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what or predicate} did not happen within {timeout:g} s")
