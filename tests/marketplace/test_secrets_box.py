"""Stored registry passwords survive a SECRET_KEY rotation done Django's way (the old key moved
to SECRET_KEY_FALLBACKS), and one sealed under a key that is gone is reported unreadable
(None, logged), never a crash."""

from __future__ import annotations

import logging

from marketplace.secrets_box import seal, unseal

KEY_A = "old-secret-key-a-" + "x" * 40
KEY_B = "new-secret-key-b-" + "y" * 40
PASSWORD = "registry pass with spaces and $(id)"


def test_a_secret_sealed_before_a_rotation_opens_with_the_old_key_as_fallback(settings):
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = KEY_A, []
    sealed_under_a = seal(PASSWORD)

    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = KEY_B, [KEY_A]

    assert unseal(sealed_under_a) == PASSWORD


def test_new_secrets_are_sealed_with_the_current_key_not_a_fallback(settings):
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = KEY_B, [KEY_A]
    sealed_after_rotation = seal(PASSWORD)

    # Once the old key is retired, what was sealed after the rotation still opens.
    settings.SECRET_KEY_FALLBACKS = []
    assert unseal(sealed_after_rotation) == PASSWORD
    # And the old key alone cannot open it.
    settings.SECRET_KEY = KEY_A
    assert unseal(sealed_after_rotation) is None


def test_a_secret_sealed_under_a_retired_key_is_unreadable_and_says_so(settings, caplog):
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = KEY_A, []
    sealed_under_a = seal(PASSWORD)
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = KEY_B, []

    with caplog.at_level(logging.WARNING, logger="marketplace.secrets_box"):
        assert unseal(sealed_under_a) is None

    assert "SECRET_KEY_FALLBACKS" in caplog.text
    assert PASSWORD not in caplog.text


def test_a_damaged_secret_is_unreadable(settings):
    assert unseal("not a fernet token") is None
    assert unseal("") is None
