"""Reinforcement learning from checkable rewards: train.json's "rl" section (jaxgpt/config_rl.py), its prompts
(prompts.py), the group advantage and the batch of samples (samples.py), and the run (loop.py)."""
