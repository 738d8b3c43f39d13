"""The functions ``import queuety`` offers, by what they do: starting runs and talking to
them, steering them, reading them back. ``queuety`` re-exports each; import them from there."""
