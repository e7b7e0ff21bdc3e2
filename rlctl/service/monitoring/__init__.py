"""Operations: Prometheus metrics at /metrics and one access log line per request."""

from rlctl.service.monitoring.setup import install_monitoring, metrics_router

__all__ = ["install_monitoring", "metrics_router"]
