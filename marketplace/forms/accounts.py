from __future__ import annotations

from django import forms
from django.contrib.auth.forms import UserCreationForm

from marketplace.models import ApiKey, Role, User


class SignUpForm(UserCreationForm):
    email = forms.EmailField(required=True)

    class Meta:
        model = User
        fields = ["username", "email"]

    def clean_email(self) -> str:
        email = self.cleaned_data["email"].lower()
        if User.objects.filter(email__iexact=email).exists():
            raise forms.ValidationError("An account with this email already exists.")
        return email


class TeamForm(forms.Form):
    name = forms.CharField(max_length=80)


class InvitationForm(forms.Form):
    email = forms.EmailField()
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=80)
    access = forms.ChoiceField(choices=ApiKey.Access.choices, initial=ApiKey.Access.READ)
    audience = forms.ChoiceField(choices=ApiKey.Audience.choices, initial=ApiKey.Audience.RENTER)
    expires_at = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
