"""Telemetry: the event protocol, the Reporter in every worker, control, and subscribers."""
