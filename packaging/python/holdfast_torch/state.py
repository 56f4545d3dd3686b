"""holdfast's checkpoint format for a state dict: what CheckpointManager(state=...) saves.

A checkpoint directory (holdfast's, committed whole) holds three files besides holdfast's own
holdfast-metadata.json (each file's size and CRC32C):

    tensors.bin   the bytes of every tensor storage the state references, each once, each at an
                  offset that is a multiple of 64, zeros between them
    index.json    {"format": "holdfast-state/1", "byteorder": "little", "torch": "<version>",
                   "tensors_file": "tensors.bin", "tensors_bytes": N,
                   "storages": [{"offset": bytes, "nbytes": bytes}, ...],
                   "tensors": [{"storage": i, "dtype": "float32", "shape": [...],
                                "stride": [...], "offset": elements}, ...]}
    objects.pkl   the state itself, pickled (protocol 4) with every tensor replaced by the
                  persistent id ("holdfast-tensor", i): i indexes "tensors"

Reading it needs only pickle, json and torch (load() below is the whole reader; it imports
nothing of holdfast's extension): read each storage's bytes from tensors.bin into a tensor of
its own, view each tensor as ``torch.as_strided`` over its storage, unpickle objects.pkl with a
persistent_load that returns tensor i. Tensors that shared a storage when saved (tied weights,
views) share one again, and only those; the same tensor object twice is one object again.

Guarantees:
  - flatten(state) references each storage once (tied weights and views are staged once) and
    refuses, naming the key path, what it cannot save as bytes: a tensor that is not strided
    (sparse, quantized, nested), or on a device other than the CPU (CUDA tensors are not staged
    by this version: move them to the CPU, or use CheckpointManager(save=...)).
  - load(directory) checks the format, the byte order and every storage's and tensor's bounds
    against tensors.bin before it views anything, raising ValueError naming the file.
Caveats:
  - A tensor is saved by its whole storage: a small view of a large storage saves all of it.
  - Tensors load as plain tensors (a Parameter loads as a tensor; requires_grad is not kept):
    load_state_dict copies them into the model's parameters.
  - objects.pkl is a pickle: load only checkpoints you trust (as with torch.load's
    weights_only=False).
"""

import io
import json
import os
import pickle
import sys

FORMAT = "holdfast-state/1"
TENSORS = "tensors.bin"
INDEX = "index.json"
OBJECTS = "objects.pkl"
ALIGN = 64
_PID = "holdfast-tensor"


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _path_text(path):
    return "".join(f"[{k!r}]" for k in path) or "the state"


class _Table:
    """The tensors and storages of one state, each storage once."""

    def __init__(self):
        import torch
        self.torch = torch
        self.storages = []   # [untyped storage]
        self.by_storage = {}  # data_ptr -> index (nbytes > 0)
        self.tensors = []    # index entries
        self.by_tensor = {}  # id(tensor) -> index
        self.keep = []       # the tensors themselves, alive until the copy is done
        self.path = []

    def add(self, t):
        key = id(t)
        if key in self.by_tensor:
            return self.by_tensor[key]
        where = _path_text(self.path)
        if t.layout != self.torch.strided or t.is_quantized or getattr(t, "is_nested", False):
            raise TypeError(f"holdfast: the tensor at {where} is not strided ({t.layout}): "
                            "only dense tensors are saved as bytes")
        if t.device.type != "cpu":
            raise TypeError(f"holdfast: the tensor at {where} is on {t.device}: this version "
                            "stages CPU tensors only (move it to the CPU, or use "
                            "CheckpointManager(save=...))")
        s = t.untyped_storage()
        n = s.nbytes()
        sk = s.data_ptr() if n > 0 else None
        if sk is not None and sk in self.by_storage:
            si = self.by_storage[sk]
        else:
            si = len(self.storages)
            self.storages.append(s)
            if sk is not None:
                self.by_storage[sk] = si
        self.tensors.append({"storage": si, "dtype": _dtype_name(t.dtype),
                             "shape": list(t.shape), "stride": list(t.stride()),
                             "offset": int(t.storage_offset())})
        self.keep.append(t)
        self.by_tensor[key] = len(self.tensors) - 1
        return self.by_tensor[key]


class _Pickler(pickle.Pickler):
    def __init__(self, f, table):
        super().__init__(f, protocol=4)
        self.table = table

    def persistent_id(self, obj):
        if isinstance(obj, self.table.torch.Tensor):
            return (_PID, self.table.add(obj))
        return None


def _walk_paths(obj, table, path):
    """Adds the tensors of nested dicts, lists and tuples with their key paths (for messages
    that name where a bad tensor is); the pickler adds the rest (inside other objects)."""
    torch = table.torch
    if isinstance(obj, torch.Tensor):
        table.path = path
        table.add(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk_paths(v, table, path + [k])
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk_paths(v, table, path + [i])


def flatten(state):
    """(segments, objects_pkl, index_json, keep): what a staged save copies.

    segments: [(data_ptr, nbytes, offset)] of each storage, offset its place in tensors.bin;
    keep: the tensors, to hold until the bytes are copied."""
    table = _Table()
    _walk_paths(state, table, [])
    table.path = []
    buf = io.BytesIO()
    try:
        _Pickler(buf, table).dump(state)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        if isinstance(e, TypeError) and str(e).startswith("holdfast:"):
            raise
        raise TypeError(f"holdfast: the state cannot be pickled: {e}") from e
    segments, storages, at, end = [], [], 0, 0
    for s in table.storages:
        n = s.nbytes()
        segments.append((s.data_ptr(), n, at))
        storages.append({"offset": at, "nbytes": n})
        end = at + n
        at += (n + ALIGN - 1) // ALIGN * ALIGN
    import torch
    index = {"format": FORMAT, "byteorder": sys.byteorder, "torch": torch.__version__,
             "tensors_file": TENSORS, "tensors_bytes": end, "storages": storages,
             "tensors": table.tensors}
    return segments, buf.getvalue(), json.dumps(index).encode(), (table.keep, table.storages)


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, tensors):
        super().__init__(f)
        self.tensors = tensors

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == _PID):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.tensors[pid[1]]


def _bad(path, why):
    return ValueError(f"holdfast: '{path}' is not a {FORMAT} checkpoint: {why}")


def load(directory):
    """The state a CheckpointManager(state=...) saved in `directory`, tensors on the CPU."""
    import torch
    directory = os.fspath(directory)
    index_path = os.path.join(directory, INDEX)
    try:
        with open(index_path, "rb") as f:
            index = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise _bad(index_path, e) from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise _bad(index_path, f"format {index.get('format') if isinstance(index, dict) else index!r}")
    if index.get("byteorder") != sys.byteorder:
        raise _bad(index_path, f"byte order {index.get('byteorder')!r} on a {sys.byteorder} host")
    data_path = os.path.join(directory, index.get("tensors_file", TENSORS))
    size = os.path.getsize(data_path)
    if size != index.get("tensors_bytes"):
        raise _bad(data_path, f"{size} bytes, the index says {index.get('tensors_bytes')}")
    storages = []
    with open(data_path, "rb", buffering=0) as f:
        for i, s in enumerate(index["storages"]):
            off, n = int(s["offset"]), int(s["nbytes"])
            if off < 0 or n < 0 or off + n > size or off % ALIGN:
                raise _bad(index_path, f"storage {i} ({off}+{n}) is outside {size} bytes")
            raw = torch.empty(n, dtype=torch.uint8)  # a storage of its own, as when saved
            view, got = memoryview(raw.numpy()), 0
            while got < n:
                k = os.preadv(f.fileno(), [view[got:]], off + got)
                if not k:
                    raise _bad(data_path, f"ends at byte {off + got} of {size}")
                got += k
            storages.append(raw)
    tensors = []
    for i, t in enumerate(index["tensors"]):
        dtype = getattr(torch, t["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise _bad(index_path, f"tensor {i} has an unknown dtype {t['dtype']!r}")
        raw = storages[int(t["storage"])]
        item = torch.empty((), dtype=dtype).element_size()
        shape, stride, offset = list(t["shape"]), list(t["stride"]), int(t["offset"])
        count = raw.numel() // item
        last = offset + sum((d - 1) * st for d, st in zip(shape, stride) if d > 0)
        if any(d == 0 for d in shape):
            last = offset - 1
        if offset < 0 or last >= count or any(d < 0 or st < 0 for d, st in zip(shape, stride)):
            raise _bad(index_path, f"tensor {i} reaches past its storage ({count} elements)")
        base = raw[:count * item].view(dtype) if count else torch.empty(0, dtype=dtype)
        tensors.append(torch.as_strided(base, shape, stride, base.storage_offset() + offset))
    with open(os.path.join(directory, OBJECTS), "rb") as f:
        return _Unpickler(f, tensors).load()
