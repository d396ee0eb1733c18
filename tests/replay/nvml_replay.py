"""A replay of a real GPU's NVML answers under nvidia-ml-py's own Python functions.

pynvml looks every C symbol up with ``getattr(pynvml.nvmlLib, name)`` (``_nvmlGetFunctionPointer``)
and calls it with ctypes arguments: inputs by value, outputs through ``byref``/buffers. A
`ReplayLibrary` stands in for ``libnvidia-ml.so``: each attribute is a Python callable that fills
those output arguments from a capture (``tests/fixtures/nvidia-h200/nvml_probe.json``) and returns
the captured ``nvmlReturn_t``. Everything above the C boundary is pynvml's unchanged code, so
return types, version handling and errors are exactly what production code sees on that GPU.

A symbol the capture never recorded answers ``NVML_ERROR_FUNCTION_NOT_FOUND`` (the lookup raises
``AttributeError``, which pynvml turns into ``NVMLError_FunctionNotFound``) and is listed in
``ReplayLibrary.unrecorded``, so a test can say which calls a code path makes that no real GPU
answered. ``install_replay`` puts a library into the ``pynvml`` module for the duration of a
``with`` block; every capture file becomes another replay.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import inspect
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
H200 = FIXTURES / "nvidia-h200"

_SYMBOL = re.compile(r'_nvmlGetFunctionPointer\("(\w+)"\)')
_VALUE_FIELD = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _error_code(text: str) -> int:
    """``"NVMLError_NotSupported: Not Supported"`` -> NVML_ERROR_NOT_SUPPORTED."""
    name = text.split(":", 1)[0]
    for code, cls in pynvml.NVMLError._valClassMapping.items():
        if cls.__name__ == name:
            return int(code)
    raise ValueError(f"capture holds an error pynvml does not know: {text!r}")


def _symbols_of(func_name: str) -> set[str]:
    """The C symbols a pynvml Python function looks up (from its source)."""
    func = getattr(pynvml, func_name, None)
    if func is None:
        return set()
    func = inspect.unwrap(func)
    try:
        return set(_SYMBOL.findall(inspect.getsource(func)))
    except (OSError, TypeError):
        return set()


def _recorded(entry: Any) -> bool:
    """A capture entry is an answer unless the probe could not call the function (TypeError)."""
    return not (
        isinstance(entry, dict)
        and "ok" in entry
        and not entry["ok"]
        and str(entry["value"]).startswith("TypeError")
    )


def _fill(target: Any, value: Any) -> None:
    """Write a captured Python value into a ctypes object (scalar, buffer, struct, array)."""
    if isinstance(target, ctypes.Structure):
        for field in target._fields_:
            name, ftype = field[0], field[1]
            if not isinstance(value, dict) or name not in value:
                continue
            current = getattr(target, name)
            if isinstance(current, ctypes.Structure | ctypes.Array) and not isinstance(
                value[name], str
            ):
                _fill(current, value[name])
            elif issubclass(ftype, ctypes.Array) and isinstance(value[name], str):
                setattr(target, name, value[name].encode())
            else:
                setattr(target, name, value[name])
        return
    if isinstance(target, ctypes.Array):
        if isinstance(value, str):
            data = value.encode()
            ctypes.memmove(target, data, min(len(data), ctypes.sizeof(target) - 1))
            return
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if i >= len(target):
                break
            if isinstance(target[i], ctypes.Structure | ctypes.Array):
                _fill(target[i], item)
            else:
                target[i] = item
        return
    target.value = value.encode() if isinstance(value, str) else value


def _scalar(target: Any) -> bool:
    return isinstance(target, ctypes._SimpleCData)


def _is_count(outputs: list[Any], raw: list[Any]) -> bool:
    """A list answered through (count, array) arguments: the array is NULL on the size query."""
    scalar_first = isinstance(outputs[0], ctypes._SimpleCData)
    return scalar_first and (
        None in raw or (len(outputs) == 2 and isinstance(outputs[1], ctypes.Array))
    )


def _fill_counted(outputs: list[Any], value: list[Any]) -> int:
    count = outputs[0]
    if len(outputs) == 1:  # size query: NVML says how many, or that none are there
        count.value = len(value)
        return int(pynvml.NVML_SUCCESS if not value else pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    if len(value) > count.value:
        count.value = len(value)
        return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    _fill(outputs[1], value)
    count.value = len(value)
    return int(pynvml.NVML_SUCCESS)


class _Device(ctypes.Structure):
    _fields_ = [("index", ctypes.c_uint)]


class ReplayLibrary:
    """The C library of one captured node: symbol lookups answer from the capture."""

    def __init__(
        self,
        probe: dict[str, Any],
        gpm: dict[str, Any] | None = None,
        *,
        without: frozenset[str] = frozenset(),
    ) -> None:
        """``without``: symbols to treat as absent, as on an older driver that lacks them."""
        self._probe = probe
        self._without = without
        self._gpm = gpm or {}
        self._devices = [_Device(i) for i in range(int(probe["system"].get("deviceCount", 0)))]
        self._gpm_buffer = ctypes.create_string_buffer(64)  # what GPM sample handles point at
        self._fields = {int(v["id"]): v for v in probe.get("fieldValues", {}).values()}
        self._lock = threading.Lock()
        self._initialised = 0
        self.unrecorded: set[str] = set()  # symbols asked for that the capture does not hold
        self.unrecorded_fields: set[int] = set()
        self.calls: dict[str, int] = {}
        self.overrides: dict[str, Callable[..., int]] = {}
        self._by_symbol = self._index_symbols()

    @classmethod
    def from_dir(
        cls, directory: Path = H200, *, without: frozenset[str] = frozenset()
    ) -> ReplayLibrary:
        probe = json.loads((directory / "nvml_probe.json").read_text())
        gpm_path = directory / "gpm_probe.json"
        gpm = json.loads(gpm_path.read_text()) if gpm_path.is_file() else None
        return cls(probe, gpm, without=without)

    # ----- which capture entry answers which symbol -------------------------------------------
    def _index_symbols(self) -> dict[str, tuple[str, str]]:
        """symbol -> (section, capture key): the entry of the same name, else the one recorded
        pynvml function that uses only that symbol (``nvmlDeviceGetCount`` ->
        ``nvmlDeviceGetCount_v2``). A function whose source picks between symbols by argument
        (``nvmlDeviceGetMemoryInfo(h, version)``) answers only for the symbol of its own name."""
        out: dict[str, tuple[str, str]] = {}
        sections = {"system": self._probe["system"], "device": self._probe["devices"][0]}
        for section, entries in sections.items():
            for key, entry in entries.items():
                if not _recorded(entry):
                    continue
                out.setdefault(key, (section, key))
        for section, entries in sections.items():
            for key, entry in entries.items():
                if not _recorded(entry):
                    continue
                symbols = _symbols_of(key)
                if len(symbols) == 1:
                    out.setdefault(symbols.pop(), (section, key))
        return out

    def __getattr__(self, name: str) -> Callable[..., int]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._without:
            raise AttributeError(name)
        special = getattr(self, f"_sym_{name}", None)
        if name in self.overrides:
            special = self.overrides[name]
        if special is None and name not in self._by_symbol:
            self.unrecorded.add(name)
            raise AttributeError(name)

        def symbol(*args: Any) -> int:
            self.calls[name] = self.calls.get(name, 0) + 1
            if special is not None:
                return int(special(*args))
            return self._answer(name, args)

        return symbol

    # ----- the generic answer -----------------------------------------------------------------
    def _device_index(self, arg: Any) -> int | None:
        try:
            address = ctypes.cast(arg, ctypes.c_void_p).value
        except (TypeError, ctypes.ArgumentError):
            return None
        for dev in self._devices:
            if ctypes.addressof(dev) == address:
                return int(dev.index)
        return None

    def _answer(self, name: str, args: tuple[Any, ...]) -> int:
        if self._initialised <= 0:
            return int(pynvml.NVML_ERROR_UNINITIALIZED)
        section, key = self._by_symbol[name]
        entry = self._probe["system"][key] if section == "system" else None
        rest = list(args)
        if section == "device":
            index = self._device_index(rest.pop(0)) if rest else None
            if index is None:
                return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            entry = self._probe["devices"][index][key]
        inputs: list[int] = []
        outputs: list[Any] = []
        for arg in rest:
            obj = getattr(arg, "_obj", None)  # byref(x) -> x
            if obj is not None:
                outputs.append(obj)
            elif isinstance(arg, ctypes.Array):
                outputs.append(arg)
            elif isinstance(arg, ctypes._SimpleCData):
                inputs.append(int(arg.value))
            elif isinstance(arg, int):
                inputs.append(arg)
        assert entry is not None
        if "ok" not in entry:  # keyed by the Python-level arguments, e.g. "(0,)"
            entry = self._keyed(entry, inputs)
            if entry is None:
                return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not entry["ok"]:
            return _error_code(str(entry["value"]))
        value = entry["value"]
        if isinstance(value, list) and outputs and _is_count(outputs, rest):
            return _fill_counted(outputs, value)
        if len(outputs) > 1 and isinstance(value, list):
            for target, item in zip(outputs, value, strict=False):
                _fill(target, item)
        elif outputs:
            single = isinstance(value, list) and len(value) == 1
            _fill(outputs[0], value[0] if single and _scalar(outputs[0]) else value)
        return int(pynvml.NVML_SUCCESS)

    @staticmethod
    def _keyed(entries: dict[str, Any], inputs: list[int]) -> dict[str, Any] | None:
        for key, entry in entries.items():
            want = ast.literal_eval(key)
            if list(inputs[: len(want)]) == list(want) and _recorded(entry):
                return dict(entry)
        return None

    # ----- symbols with their own shape --------------------------------------------------------
    def _sym_nvmlInitWithFlags(self, flags: int) -> int:
        with self._lock:
            self._initialised += 1
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlInit_v2(self) -> int:
        return self._sym_nvmlInitWithFlags(0)

    def _sym_nvmlShutdown(self) -> int:
        with self._lock:
            if self._initialised <= 0:
                return int(pynvml.NVML_ERROR_UNINITIALIZED)
            self._initialised -= 1
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlDeviceGetCount_v2(self, count: Any) -> int:
        if self._initialised <= 0:
            return int(pynvml.NVML_ERROR_UNINITIALIZED)
        count._obj.value = len(self._devices)
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        if self._initialised <= 0:
            return int(pynvml.NVML_ERROR_UNINITIALIZED)
        i = int(index.value)
        if not 0 <= i < len(self._devices):
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        address = ctypes.c_void_p(ctypes.addressof(self._devices[i]))
        ctypes.memmove(
            ctypes.addressof(device._obj), ctypes.addressof(address), ctypes.sizeof(address)
        )
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        index = self._device_index(handle)
        if index is None:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        array = values._obj
        for i in range(int(count.value)):
            fv = array[i]
            captured = self._fields.get(int(fv.fieldId))
            if captured is None:
                self.unrecorded_fields.add(int(fv.fieldId))
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            fv.nvmlReturn = int(captured["nvmlReturn"])
            fv.valueType = int(captured.get("valueType", 0))
            fv.latencyUsec = int(captured.get("us", 0))
            if fv.nvmlReturn == pynvml.NVML_SUCCESS:
                setattr(fv.value, _VALUE_FIELD[fv.valueType], captured["value"])
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlEventSetCreate(self, event_set: Any) -> int:
        events = self._probe.get("events", {})
        return int(pynvml.NVML_SUCCESS if events.get("ok") else pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _sym_nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        supported = int(self._probe.get("events", {}).get("supported", 0))
        if self._device_index(handle) is None:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        ok = int(types.value) & ~supported == 0
        return int(pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _sym_nvmlEventSetWait_v2(self, event_set: Any, data: Any, timeout: Any) -> int:
        wait = str(self._probe.get("events", {}).get("wait", ""))
        return _error_code(wait) if wait.startswith("NVMLError") else int(pynvml.NVML_SUCCESS)

    def _sym_nvmlEventSetFree(self, event_set: Any) -> int:
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlGpmQueryDeviceSupport(self, handle: Any, support: Any) -> int:
        if not self._gpm:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        support._obj.isSupportedDevice = int(self._gpm.get("gpm_supported", 0))
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlGpmSampleAlloc(self, sample: Any) -> int:
        if not self._gpm:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slot = ctypes.c_void_p(ctypes.addressof(self._gpm_buffer))
        ctypes.memmove(ctypes.addressof(sample._obj), ctypes.addressof(slot), ctypes.sizeof(slot))
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        if self._device_index(handle) is None:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(pynvml.NVML_SUCCESS if self._gpm else pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _sym_nvmlGpmSampleFree(self, sample: Any) -> int:
        return int(pynvml.NVML_SUCCESS)

    def _sym_nvmlGpmMetricsGet(self, request: Any) -> int:
        """The idle window's metrics (``gpm_probe.json`` ``gpm_idle``), by metric id."""
        window = self._gpm.get("gpm_idle", {})
        names = {int(getattr(pynvml, name)): name for name in window if hasattr(pynvml, name)}
        mg = request._obj
        for i in range(int(mg.numMetrics)):
            metric = mg.metrics[i]
            captured = window.get(names.get(int(metric.metricId), ""))
            if captured is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn = int(captured["ret"])
            metric.value = float(captured["value"])
        return int(pynvml.NVML_SUCCESS)


@contextlib.contextmanager
def install_replay(lib: ReplayLibrary) -> Iterator[ReplayLibrary]:
    """Make ``pynvml`` call ``lib`` instead of libnvidia-ml for the duration of the block."""
    with pynvml.libLoadLock:
        saved_lib = pynvml.nvmlLib
        saved_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield lib
    finally:
        with pynvml.libLoadLock:
            pynvml.nvmlLib = saved_lib
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)
