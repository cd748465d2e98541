from __future__ import annotations

import functools

import factory
from django.contrib.auth.hashers import make_password

from marketplace.models import Membership, Role, Team, User

PASSWORD = "pw-for-tests-123"


@functools.cache
def password_hash() -> str:
    """The real hash of ``PASSWORD`` (the project's hasher), made once per process: hashing
    is slow on purpose, and a fresh salt per user would cost seconds in every test that makes
    one, with nothing more checked."""
    return make_password(PASSWORD)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    # The personal team comes from the user_created receiver, as for every user.
    password = factory.LazyFunction(password_hash)


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    name = factory.Sequence(lambda n: f"Team {n}")


def add_member(team: Team, user: User, role: Role = Role.MEMBER) -> Membership:
    return Membership.objects.create(team=team, user=user, role=role)
