"""Conversations: the chat template shared by fine-tuning, the chat command, the judge and the server."""
