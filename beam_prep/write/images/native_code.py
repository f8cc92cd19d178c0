"""Machine code compiled ahead of time, loaded into this process without a compiler.

numba compiles the resize kernel; keeping numba and LLVM in every worker to run
it costs about 150 MB of memory a process and half a second of start-up. So the
kernel is compiled once per machine (``resample_build``, in a process of its
own) into an ELF object file, and each worker maps that object's code here,
with the few relocations an x86-64 object of position-independent code holds:
what a dynamic linker does for a shared library, for one small file.

Linux on x86-64 only (``supported()``); elsewhere numba runs the kernel in process.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import platform
import struct
import sys

__all__ = ["NativeCode", "NativeCodeError", "cpu_identity", "load", "supported"]

_SHF_ALLOC = 0x2
_SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS = 2, 4, 8
_STT_FUNC = 2
_R_X86_64_64, _R_X86_64_PC32, _R_X86_64_PLT32 = 1, 2, 4
_GOT_RELOCATIONS = frozenset({9, 41, 42})  # GOTPCREL, GOTPCRELX, REX_GOTPCRELX
_SKIPPED_SECTIONS = frozenset({".eh_frame"})  # unwind tables: nothing unwinds through the kernel
_JUMP = b"\xff\x25\x00\x00\x00\x00"  # jmp *0(%rip): a stub that jumps to the address after it
_STUB_SIZE = 16


class NativeCodeError(Exception):
    """An object file this loader cannot map: another format, or a relocation it does not know."""


class NativeCode:
    """An object file's code, mapped executable for as long as this object lives.

    Args:
      region: the mapping that holds the code (kept open here).
      functions: each function's name and address in it.
    """

    def __init__(self, region: mmap.mmap, functions: dict[str, int]) -> None:
        self._region = region
        self.functions = functions

    def function(self, prefix: str, prototype: type) -> ctypes._CFuncPtr:
        """The one function whose name starts with ``prefix``, callable through ``prototype``
        (a ``ctypes.CFUNCTYPE``); the caller keeps this object alive while it calls it."""
        (name,) = [n for n in self.functions if n.startswith(prefix)]
        return prototype(self.functions[name])


def supported() -> bool:
    """Whether this loader runs here: Linux, x86-64."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def cpu_identity() -> str:
    """The processor model and its feature flags, as the kernel is compiled for them: code
    built on one machine runs on another with the same identity."""
    model = flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = " ".join(sorted(value.split()))
                if model and flags:
                    break
    except OSError:
        pass
    return f"{platform.machine()} {model} {flags}"


def load(obj: bytes) -> NativeCode:
    """Maps an ELF64 x86-64 relocatable object's code and data and links it in place.

    Its sections go into one private mapping; symbols it does not define are looked up in
    this process (libc, Python's C API), each given a GOT slot and a jump stub in the
    mapping; then the mapping is made read-only and executable.

    Raises:
      NativeCodeError: not an ELF64 little-endian x86-64 object, or a relocation type other
        than the position-independent ones above.
    """
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1 or struct.unpack_from("<H", obj, 0x12)[0] != 62:
        raise NativeCodeError("not an ELF64 little-endian x86-64 object")
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", obj, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]

    def text(offset: int) -> str:
        return obj[offset:obj.index(b"\0", offset)].decode()

    names = [text(sections[shstrndx][4] + s[0]) for s in sections]
    placed: dict[int, int] = {}  # section index -> offset in the mapping
    size = 0
    for index, (name, section) in enumerate(zip(names, sections)):
        if section[2] & _SHF_ALLOC and name not in _SKIPPED_SECTIONS:
            align = max(section[8], 1)
            size = -(-size // align) * align
            placed[index] = size
            size += section[5]
    symtab = next(s for s in sections if s[1] == _SHT_SYMTAB)
    strings = sections[symtab[6]][4]
    # (name, info, other, section index, value, size)
    symbols = [struct.unpack_from("<IBBHQQ", obj, symtab[4] + j * 24) for j in range(symtab[5] // 24)]
    external = [j for j, sym in enumerate(symbols) if j and sym[3] == 0]
    slot = {j: k for k, j in enumerate(external)}
    got = -(-size // 16) * 16
    stubs = got + 8 * len(external)
    length = -(-(stubs + _STUB_SIZE * len(external)) // mmap.PAGESIZE) * mmap.PAGESIZE
    region = mmap.mmap(-1, length, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    for index, offset in placed.items():
        section = sections[index]
        if section[1] != _SHT_NOBITS:
            region[offset:offset + section[5]] = obj[section[4]:section[4] + section[5]]
    for j, k in slot.items():
        address = _process_symbol(text(strings + symbols[j][0]))
        struct.pack_into("<Q", region, got + 8 * k, address)
        region[stubs + _STUB_SIZE * k:stubs + _STUB_SIZE * k + len(_JUMP)] = _JUMP
        struct.pack_into("<Q", region, stubs + _STUB_SIZE * k + len(_JUMP), address)

    def defined(j: int) -> int | None:
        sym = symbols[j]
        return None if sym[3] == 0 else base + placed[sym[3]] + sym[4]

    for section in sections:
        if section[1] != _SHT_RELA or section[7] not in placed:
            continue
        target = placed[section[7]]
        for r in range(section[5] // 24):
            offset, info, addend = struct.unpack_from("<QQq", obj, section[4] + r * 24)
            j, kind = info >> 32, info & 0xFFFFFFFF
            place = base + target + offset
            address = defined(j)
            if kind == _R_X86_64_64:
                value = (address if address is not None else struct.unpack_from("<Q", region, got + 8 * slot[j])[0])
                struct.pack_into("<Q", region, target + offset, value + addend)
            elif kind in (_R_X86_64_PC32, _R_X86_64_PLT32):
                destination = address if address is not None else base + stubs + _STUB_SIZE * slot[j]
                struct.pack_into("<i", region, target + offset, destination + addend - place)
            elif kind in _GOT_RELOCATIONS and address is None:
                struct.pack_into("<i", region, target + offset, base + got + 8 * slot[j] + addend - place)
            else:
                region.close()
                raise NativeCodeError(f"relocation type {kind} in {names[section[7]]} is not supported")
    if _libc().mprotect(ctypes.c_void_p(base), length, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        region.close()
        raise NativeCodeError(f"cannot make the code executable: errno {ctypes.get_errno()}")
    functions = {text(strings + sym[0]): base + placed[sym[3]] + sym[4]
                 for sym in symbols if sym[3] in placed and sym[1] & 0xF == _STT_FUNC}
    return NativeCode(region, functions)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.dlsym.restype = ctypes.c_void_p
    libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return libc


def _process_symbol(name: str) -> int:
    """A symbol of this process (libc, Python); 0 for one it lacks (numba's error helpers, on
    paths the kernel never takes: it raises nothing), which would fault if ever called."""
    return _libc().dlsym(None, name.encode()) or 0
