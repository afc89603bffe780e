"""The token datasets on disk: the shard format, reading memory-mapped, writing atomically."""
