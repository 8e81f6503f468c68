"""Suite-wide settings: hypothesis judges properties, not speed (a busy CI machine is slow)."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "batchgate", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("batchgate")
