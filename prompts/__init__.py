"""Prompt text, and nothing else: every string the models read lives here."""
