"""Vocabulary shared by every layer: hook names and raw capture keys. Imports nothing of harness or overlays; overlays may import it."""
