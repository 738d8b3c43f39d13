"""Storage plumbing: the only modules that hold SQL, table names and row or advisory locks.

``definitions`` caches the immutable definition rows, ``sql`` names every raw statement, and
``rows`` holds the cursor, lock and row helpers the runtime and the use cases share.
"""
