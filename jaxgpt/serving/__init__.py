"""serve.py's server: the OpenAI API (api.py, protocol.py, responses.py) over the generation engine
turned on one thread (worker.py)."""
