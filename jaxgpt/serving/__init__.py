"""serve.py's server: the OpenAI API (api.py, protocol.py, responses.py) over one engine thread that decodes
every request together (engine.py) in a KV cache whose rows start on their own (rows.py)."""
