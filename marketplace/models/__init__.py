from marketplace.models.rentals import Offer, Rental, SshKey
from marketplace.models.tenancy import ApiKey, Invitation, Membership, Role, Team, User

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
