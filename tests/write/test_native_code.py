"""The loader of compiled machine code: an object file's functions callable, anything else refused."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from beam_prep.write.images import native_code, resample, resample_loader

pytestmark = pytest.mark.skipif(not native_code.supported(), reason="machine code is mapped on Linux x86-64 only")


@pytest.fixture(scope="module")
def objects():
    resample.load()
    return resample_loader.unpack_objects(resample_loader.kernel_file().read_bytes())


def test_a_mapped_function_computes_what_numba_does(objects):
    symbol, obj = objects["transpose8"]
    code = native_code.load(obj)
    transpose = code.function(symbol, ctypes.CFUNCTYPE(None, *[ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                                                ctypes.c_int64, ctypes.c_void_p]))
    src = np.arange(37 * 53, dtype=np.uint64).astype(np.uint8).reshape(37, 53)
    part = src[:, 5:46]
    out = np.zeros((41, 37), np.uint8)
    transpose(part.ctypes.data, 53, 37, 41, out.ctypes.data)
    np.testing.assert_array_equal(out, part.T)


@pytest.mark.parametrize("data,message", [
    (b"not an object file at all", "not an ELF64 little-endian x86-64 object"),
    (b"\x7fELF\x01\x01" + bytes(60), "not an ELF64 little-endian x86-64 object"),  # 32-bit
])
def test_anything_but_an_x86_64_object_is_refused(data, message):
    with pytest.raises(native_code.NativeCodeError, match=message):
        native_code.load(data)


def test_a_damaged_kernel_file_is_refused_by_its_checksum(objects):
    packed = bytearray(resample_loader.pack_objects(objects))
    packed[len(packed) // 2] ^= 1
    with pytest.raises(ValueError, match="damaged"):
        resample_loader.unpack_objects(bytes(packed))
    assert resample_loader.unpack_objects(resample_loader.pack_objects(objects)) == objects
