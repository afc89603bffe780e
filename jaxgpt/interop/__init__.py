"""Weights in and out of other formats: OpenAI's GPT-2 layout, transformers' nanochat type, tokenizer files."""
