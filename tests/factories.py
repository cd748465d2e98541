from __future__ import annotations

import factory

from marketplace.models import Membership, Role, Team, User


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", "pw-for-tests-123")

    @factory.post_generation
    def save_password(self, create, extracted, **kwargs):
        # The personal team comes from the user_created receiver, as for every user.
        if create:
            self.save()


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    name = factory.Sequence(lambda n: f"Team {n}")


def add_member(team: Team, user: User, role: Role = Role.MEMBER) -> Membership:
    return Membership.objects.create(team=team, user=user, role=role)
