"""API authentication: ``Authorization: Bearer <api key>``."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from marketplace.models import ApiKey
from marketplace.services.accounts import api_key_authenticate


class ApiKeyUser:
    """The principal behind an API key: authenticated, acting for the key's team only."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    def __init__(self, api_key: ApiKey):
        self.api_key = api_key
        self.username = f"api-key:{api_key.prefix}"

    def __str__(self) -> str:
        return self.username


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        token = token.strip()
        if not token:
            raise exceptions.AuthenticationFailed("The Authorization header has no key.")
        api_key = api_key_authenticate(token)
        if api_key is None:
            raise exceptions.AuthenticationFailed("The API key is unknown, revoked or expired.")
        return ApiKeyUser(api_key), api_key

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (not 403) to a request without credentials.
        return f'{self.keyword} realm="api"'
