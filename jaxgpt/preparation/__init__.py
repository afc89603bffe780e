"""Datasets made from any source (documents or conversations) and tokenizers trained on a corpus."""
