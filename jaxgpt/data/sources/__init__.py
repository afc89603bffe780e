"""Where documents come from: local files, the built-in corpus, parquet, FineWeb and FineWeb-Edu."""
