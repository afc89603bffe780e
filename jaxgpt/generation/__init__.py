"""Generation: the engine every caller draws answers from (engine.py), its KV cache and programs
(decoder.py), the sampling parameters and draw (sampling.py), and an answer's text (text.py)."""
