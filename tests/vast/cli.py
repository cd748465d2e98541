"""The official ``vastai`` CLI, pinned, in a virtualenv of its own.

vastai 1.9.1 pins cryptography and pillow at versions that conflict with ours, so it never goes
into .venv: it is installed into ``var/vastai-cli/`` the first time a test needs it (a few
seconds from PyPI), and found there afterwards. A file lock keeps parallel test workers from
installing it twice at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI_VERSION = "1.9.1"
CLI_DIR = ROOT / "var" / "vastai-cli"
FORKSERVER = Path(__file__).with_name("cli_forkserver.py")
TIMEOUT_S = 120


def installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    found = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('vastai'))"],
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() if found.returncode == 0 else None


def ensure_cli() -> Path:
    """The path of the pinned ``vastai`` executable, installing it if it is not there yet."""
    python, executable = CLI_DIR / "bin" / "python", CLI_DIR / "bin" / "vastai"
    CLI_DIR.parent.mkdir(parents=True, exist_ok=True)
    with open(CLI_DIR.parent / "vastai-cli.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed_version(python) != CLI_VERSION:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(CLI_DIR)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 f"vastai=={CLI_VERSION}"],
                check=True,
            )  # fmt: skip
    return executable


@dataclass
class Run:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def crashed(self) -> bool:
        """A Python traceback: the CLI met a shape it could not read."""
        return "Traceback (most recent call last)" in self.output


class VastCli:
    """Runs ``vastai --url <server> --api-key <key> <command…>`` as a user would.

    Each command runs in a process of its own, forked from one that has imported the CLI
    (tests/vast/cli_forkserver.py): the same ``main()`` on the same command line, files and
    environment as the ``vastai`` script, without a second of imports per command. Use it as a
    context manager, or ``close()`` it, to stop that process."""

    def __init__(self, executable: Path, url: str, api_key: str, home: Path):
        self.executable, self.url, self.api_key, self.home = executable, url, api_key, home
        self._server: subprocess.Popen | None = None

    def environment(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),  # no saved key or config of whoever runs the tests
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_STATE_HOME": str(self.home / ".state"),
            "VASTAI_NO_UPDATE_CHECK": "1",  # it would ask the internet for a newer release
            "COLUMNS": "400",  # one table row per line, as on a wide terminal
            "LANG": "C.UTF-8",
        }

    def server(self) -> subprocess.Popen:
        if self._server is None:
            self._server = subprocess.Popen(
                [str(self.executable.parent / "python"), str(FORKSERVER), str(self.executable)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env=self.environment(),
            )  # fmt: skip
        return self._server

    def __call__(
        self, *command: str, raw: bool = False, key: str | None = None, answer: str = ""
    ) -> Run:
        """``answer``: what the user types at the CLI's prompt ("y"), if it asks."""
        args = ["--url", self.url, "--api-key", key or self.api_key]
        args += ["--raw"] if raw else []
        args += list(command)
        server = self.server()
        request = {"args": args, "input": answer + "\n", "timeout": TIMEOUT_S}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"the vastai fork server stopped (status {server.wait()})")
        done = json.loads(line)
        if done["returncode"] is None:
            raise subprocess.TimeoutExpired([str(self.executable), *args], TIMEOUT_S)
        return Run(list(command), done["returncode"], done["stdout"], done["stderr"])

    def close(self) -> None:
        if self._server is not None:
            self._server.stdin.close()  # the server ends at the end of its requests
            self._server.wait(timeout=30)
            self._server.stdout.close()
            self._server = None

    def __enter__(self) -> VastCli:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
