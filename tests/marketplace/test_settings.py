from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "HTTPS_ONLY", "SECRET_KEY"}}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_settings_pass_the_deploy_check():
    result = run_manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        env={
            "DEBUG": "0",
            "SECRET_KEY": "k" * 30 + "-production-like-secret-with-enough-entropy-9f8e7d",
            "ALLOWED_HOSTS": "gpus.example.com",
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key():
    result = run_manage("check", env={"DEBUG": "0"})
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_development_generates_and_keeps_a_secret_key(tmp_path):
    env = {"DEBUG": "1", "VAR_DIR": str(tmp_path)}
    assert run_manage("check", env=env).returncode == 0
    first = (tmp_path / "secret_key").read_text()
    assert len(first) >= 50
    assert run_manage("check", env=env).returncode == 0
    assert (tmp_path / "secret_key").read_text() == first


def test_a_rotated_secret_key_still_opens_registry_passwords_sealed_under_the_old_one():
    """An operator rotates through the environment: SECRET_KEY is the new key and
    SECRET_KEY_FALLBACKS lists the old one, so a password sealed before still opens."""
    old, new = "old-" + "a" * 50, "new-" + "b" * 50
    code = "from marketplace.secrets_box import seal; print(seal('robot-pass'))"
    sealed = run_manage("shell", "--no-imports", "-c", code, env={"DEBUG": "1", "SECRET_KEY": old})
    assert sealed.returncode == 0, sealed.stderr
    token = sealed.stdout.strip()
    opened = f"from marketplace.secrets_box import unseal; print(unseal({token!r}))"
    rotated = {"DEBUG": "1", "SECRET_KEY": new, "SECRET_KEY_FALLBACKS": f"{old}, "}
    assert (
        run_manage("shell", "--no-imports", "-c", opened, env=rotated).stdout.strip()
        == "robot-pass"
    )
    forgotten = run_manage(
        "shell", "--no-imports", "-c", opened, env={"DEBUG": "1", "SECRET_KEY": new}
    )
    assert forgotten.stdout.strip() == "None"
