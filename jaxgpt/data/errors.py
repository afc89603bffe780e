"""The one error of the data layer: a dataset, file or option that cannot be used."""


class DataError(ValueError):
    """A dataset is missing, incomplete, corrupt or unusable (one-line message naming the file)."""
