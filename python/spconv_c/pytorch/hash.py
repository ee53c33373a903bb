"""spconv.pytorch.hash.HashTable's interface (``from spconv_c.pytorch.hash import HashTable``).

spconv 2.x's table is a fixed-size GPU hash table (its CPU wheel refuses every insert: "spconv
not compiled with cuda"), used by custom sparse ops to number coordinates. This one holds its keys
and values as tensors on the table's device, in the order their keys were first inserted, with a
sorted copy of the keys to look them up (torch's sort and searchsorted), so that it runs on any
device and gives the same answer every time:

- a key given twice in one insert, or inserted again later, keeps one slot; its value is the
  last one given (as assigning them one after the other would);
- ``assign_arange_`` numbers the keys in the order of their first insertion, and ``items``
  returns them in that order (spconv's order is its table's slot order, which nothing defines);
- ``query`` writes the values of the keys it finds and leaves the other rows of ``values`` as
  they were (zeros when it makes ``values``);
- the table grows as keys come (``max_size`` is taken for spconv's signature and not needed).
"""

import torch

_KEY_DTYPES = (torch.int32, torch.int64)
_VALUE_DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)


class HashTable:
    """Keys int32 / int64 [N] to values of a 32- or 64-bit dtype (see the module docstring)."""

    def __init__(self, device, key_dtype, value_dtype, max_size=-1):
        if key_dtype not in _KEY_DTYPES:
            raise ValueError(f"spconv_c: HashTable keys must be int32 or int64, got {key_dtype}")
        if value_dtype not in _VALUE_DTYPES:
            raise ValueError(f"spconv_c: HashTable values must be int32, int64, float32 or "
                             f"float64, got {value_dtype}")
        self.device = torch.device(device)
        self.is_cpu = self.device.type == "cpu"
        self.key_dtype, self.value_dtype = key_dtype, value_dtype
        self.max_size = max_size
        self._keys = torch.empty(0, dtype=key_dtype, device=self.device)
        self._values = torch.zeros(0, dtype=value_dtype, device=self.device)
        self._sorted = self._keys
        self._slot = torch.empty(0, dtype=torch.int64, device=self.device)

    def _check(self, what, keys, values=None):
        if keys.dtype != self.key_dtype or keys.dim() != 1 or keys.device != self.device:
            raise ValueError(f"spconv_c: HashTable.{what}: keys must be {self.key_dtype} [N] on "
                             f"{self.device}, got {keys.dtype} {list(keys.shape)} on "
                             f"{keys.device}")
        if values is not None and (values.dtype != self.value_dtype
                                   or list(values.shape) != list(keys.shape)
                                   or values.device != self.device):
            raise ValueError(f"spconv_c: HashTable.{what}: values must be {self.value_dtype} "
                             f"{list(keys.shape)} on {self.device}, got {values.dtype} "
                             f"{list(values.shape)} on {values.device}")

    def _find(self, keys):
        """Each key's slot, -1 where the table does not hold it."""
        if self._sorted.numel() == 0:
            return torch.full(keys.shape, -1, dtype=torch.int64, device=self.device)
        at = torch.searchsorted(self._sorted, keys).clamp_(max=self._sorted.numel() - 1)
        return torch.where(self._sorted[at] == keys, self._slot[at], -1)

    def _assign(self, slots, values):
        """values[i] into slot slots[i] where slots[i] >= 0; of several rows for one slot, the
        last one's."""
        rows = torch.arange(slots.numel(), device=self.device)
        held = slots >= 0
        slots, rows = slots[held], rows[held]
        if slots.numel() == 0:
            return
        last = torch.full((self._keys.numel(),), -1, dtype=torch.int64, device=self.device)
        last.scatter_reduce_(0, slots, rows, "amax")
        hit = last >= 0
        self._values[hit] = values[last[hit]]

    def insert(self, keys, values=None):
        """Insert ``keys`` (with ``values``, else with values undefined: zeros here)."""
        self._check("insert", keys, values)
        slots = self._find(keys)
        new = slots < 0
        if new.any():
            fresh = keys[new]
            unique, inverse = torch.unique(fresh, return_inverse=True)
            first = torch.full((unique.numel(),), fresh.numel(), dtype=torch.int64,
                               device=self.device)
            first.scatter_reduce_(0, inverse, torch.arange(fresh.numel(), device=self.device),
                                  "amin")
            added = fresh[first.sort().values]  # in order of first occurrence
            self._keys = torch.cat([self._keys, added])
            self._values = torch.cat([self._values, torch.zeros(
                added.numel(), dtype=self.value_dtype, device=self.device)])
            self._sorted, self._slot = torch.sort(self._keys)
            slots = self._find(keys)
        if values is not None:
            self._assign(slots, values)

    def query(self, keys, values=None):
        """(values, is_empty): the values of ``keys``, and a bool mask of the keys the table
        does not hold (their rows of ``values`` are left as they were)."""
        self._check("query", keys, values)
        slots = self._find(keys)
        if values is None:
            values = torch.zeros(keys.shape, dtype=self.value_dtype, device=self.device)
        found = slots >= 0
        values[found] = self._values[slots[found]]
        return values, ~found

    def insert_exist_keys(self, keys, values):
        """Set the values of those ``keys`` the table holds; a uint8 mask of the others."""
        self._check("insert_exist_keys", keys, values)
        slots = self._find(keys)
        self._assign(slots, values)
        return (slots < 0).to(torch.uint8)

    def assign_arange_(self):
        """Number the keys 0, 1, ... in the order of their first insertion (int values only);
        returns their count, as spconv does (int64 [1]; on a GPU of the keys' width)."""
        if self.value_dtype not in (torch.int32, torch.int64):
            raise ValueError(f"spconv_c: HashTable.assign_arange_ needs int32 or int64 values, "
                             f"the table's are {self.value_dtype}")
        n = self._keys.numel()
        self._values = torch.arange(n, dtype=self.value_dtype, device=self.device)
        return self._count()

    def items(self, max_size=-1):
        """(keys, values, count): the keys in the order of their first insertion and their
        values (spconv's GPU table returns buffers of ``max_size`` whose first ``count`` rows
        hold them; these hold exactly them)."""
        return self._keys.clone(), self._values.clone(), self._count()

    def _count(self):
        n = self._keys.numel()
        if self.is_cpu or self.key_dtype == torch.int64:
            return torch.tensor([n], dtype=torch.int64, device=self.device)
        return torch.tensor([n], dtype=torch.int32, device=self.device)
