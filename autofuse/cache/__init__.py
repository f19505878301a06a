"""The plan cache: tuned plans and their kernels on disk (``store``), keyed by everything that
changes their output (``keys``), encoded as JSON (``codec``), loaded by production processes
with no tuning (``load``)."""

from autofuse.cache.disk import (
    EntryInfo,
    entry_dir,
    list_entries,
    load_metadata,
    load_plan,
    plans_dir,
    save_plan,
    store,
)
from autofuse.cache.keys import (
    CACHE_FORMAT,
    TUNING_OPTIONS,
    CacheMiss,
    CacheMissWarning,
    CacheWarning,
    DeviceInfo,
    inputs_device,
    key_for,
    key_options,
    key_parts,
    plan_key,
)
from autofuse.cache.load import EagerFunction, load

__all__ = [
    "CACHE_FORMAT",
    "TUNING_OPTIONS",
    "CacheMiss",
    "CacheMissWarning",
    "CacheWarning",
    "DeviceInfo",
    "EagerFunction",
    "EntryInfo",
    "entry_dir",
    "inputs_device",
    "key_for",
    "key_options",
    "key_parts",
    "list_entries",
    "load",
    "load_metadata",
    "load_plan",
    "plan_key",
    "plans_dir",
    "save_plan",
    "store",
]
