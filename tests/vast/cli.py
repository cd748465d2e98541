"""The official ``vastai`` CLI, pinned, in a virtualenv of its own.

vastai 1.9.1 pins cryptography and pillow at versions that conflict with ours, so it never goes
into .venv: it is installed into ``var/vastai-cli/`` the first time a test needs it (a few
seconds from PyPI), and found there afterwards. A file lock keeps parallel test workers from
installing it twice at once.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI_VERSION = "1.9.1"
CLI_DIR = ROOT / "var" / "vastai-cli"


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
    """Runs ``vastai --url <server> --api-key <key> <command…>`` as a user would."""

    def __init__(self, executable: Path, url: str, api_key: str, home: Path):
        self.executable, self.url, self.api_key, self.home = executable, url, api_key, home

    def __call__(
        self, *command: str, raw: bool = False, key: str | None = None, answer: str = ""
    ) -> Run:
        """``answer``: what the user types at the CLI's prompt ("y"), if it asks."""
        args = [str(self.executable), "--url", self.url, "--api-key", key or self.api_key]
        args += ["--raw"] if raw else []
        args += list(command)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),  # no saved key or config of whoever runs the tests
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_STATE_HOME": str(self.home / ".state"),
            "VASTAI_NO_UPDATE_CHECK": "1",  # it would ask the internet for a newer release
            "COLUMNS": "400",  # one table row per line, as on a wide terminal
            "LANG": "C.UTF-8",
        }
        done = subprocess.run(
            args, capture_output=True, text=True, env=env, timeout=120, input=answer + "\n"
        )
        return Run(list(command), done.returncode, done.stdout, done.stderr)
