"""The REST API: signals, approvals, input and run status over Django REST Framework."""
