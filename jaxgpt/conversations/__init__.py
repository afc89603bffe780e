"""Conversations and fine-tuning: chat templates, conversation files and the built-in instruction set,
their datasets and rows, and a model answering through its template (the assistant, the judge)."""
