"""The chat app's widgets, one per module."""
