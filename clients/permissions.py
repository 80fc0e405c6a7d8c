"""Who may call which endpoint, beyond being an authenticated client."""

from rest_framework.permissions import BasePermission


class IsOperator(BasePermission):
    """Operator endpoints (contract section 3): 403 for a client that is not an operator."""

    message = "Only an operator client may do this."

    def has_permission(self, request, view) -> bool:
        return bool(getattr(request.user, "is_operator", False))
