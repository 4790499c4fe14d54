"""Data: loader rebuilding, device transfer and prefetch (more in later modules)."""
