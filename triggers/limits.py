"""Size limits shared by everything a wait carries.

One constant, so that a trigger's serialized kwargs (checked when a task defers) and an
event's payload (checked when it is sent) are held to the same bound: both are stored in
a row that the triggerer or a worker reads back whole.
"""

from __future__ import annotations

# The most a serialized trigger's kwargs or an event's payload may hold, in bytes of its
# compact JSON (UTF-8). 64 KiB: far above a bucket and a key or a partner's callback, far
# below what would make loading 100,000 waits or listing events costly.
MAX_SERIALIZED_BYTES = 64 * 1024
