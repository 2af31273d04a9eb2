"""The prefix cache's tiers below the KV pool: host RAM and a disk directory.

The scheduler's side (tier_planner.py, tier_index.py) decides which evicted blocks are
saved and which come back, as plain bookkeeping of block hashes; the worker's side
(host_tier.py, disk_tier.py, block_file.py) moves the bytes. disk_layout.py names the
directory's files and keeps its hash key; fingerprint.py says whose KV a file holds.
"""
