from marketplace.models.accounts import ApiKey, Invitation, Membership, Role, Team, User
from marketplace.models.rentals import Offer, Rental, SshKey

__all__ = [
    "ApiKey",
    "Rental",
    "Invitation",
    "Membership",
    "Offer",
    "Role",
    "SshKey",
    "Team",
    "User",
]
