"""Compiles the resize kernel to machine code for this machine: ``python -m beam_prep.write.images.resample_build PATH``.

Run by ``resample`` in a process of its own when the kernel is not yet built
for this CPU (a worker never imports numba or LLVM), and by the Dataflow
image's build. The kernel's functions (``resample_kernel``) get C entry points
(numba ``cfunc``), each compiled to position-independent code for this CPU and
written with the others into one file (``resample_loader.pack_objects``), atomically.
"""
from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import llvmlite.binding as llvm
from numba import carray, cfunc, types

from beam_prep.write.images import resample_kernel as kernel
from beam_prep.write.images.resample_loader import pack_objects

_U8, _U32, _I32, _I64 = (types.CPointer(t) for t in (types.uint8, types.uint32, types.int32, types.int64))
_OPTIONS = {"nopython": True, "error_model": "numpy", "boundscheck": False}


@cfunc(types.void(types.int64, types.float32, types.float32, types.int64, types.int64, _I32, _I32), **_OPTIONS)
def _coefficients(in_size, in0, in1, out_size, taps, bounds, weights):
    kernel.fill_coefficients(in_size, in0, in1, out_size, carray(bounds, (out_size, 2)),
                             carray(weights, (out_size, taps)))


@cfunc(types.void(_U8, types.int64, types.int64, _I32, _I32, types.int64, _U8, types.int64, _I32), **_OPTIONS)
def _filter_rows(src, rows, width, bounds, weights, taps, out, out_rows, acc):
    kernel.filter_rows(carray(src, (rows, width)), carray(bounds, (out_rows, 2)),
                       carray(weights, (out_rows, taps)), carray(out, (out_rows, width)), carray(acc, (width,)))


@cfunc(types.void(_U32, types.int64, types.int64, types.int64, _U32), **_OPTIONS)
def _transpose32(src, stride, rows, cols, out):
    kernel.transpose(carray(src, (rows, stride))[:, :cols], carray(out, (cols, rows)))


@cfunc(types.void(_U8, types.int64, types.int64, types.int64, _U8), **_OPTIONS)
def _transpose8(src, stride, rows, cols, out):
    kernel.transpose(carray(src, (rows, stride))[:, :cols], carray(out, (cols, rows)))


ENTRY_POINTS = {"coefficients": _coefficients, "filter_rows": _filter_rows,
                "transpose32": _transpose32, "transpose8": _transpose8}


def build() -> bytes:
    """The kernel's entry points as one file of position-independent objects for this CPU."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3,
        reloc="pic", codemodel="small")
    objects = {}
    for name, entry in ENTRY_POINTS.items():
        module = llvm.parse_assembly(entry._library.get_llvm_str())
        module.verify()
        objects[name] = (entry.native_name, machine.emit_object(module))
    return pack_objects(objects)


def main(argv: list[str]) -> None:
    target = pathlib.Path(argv[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as f:
        f.write(build())
    os.replace(f.name, target)


if __name__ == "__main__":
    main(sys.argv[1:])
