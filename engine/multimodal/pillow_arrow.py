"""An RGB PIL image's pixels where Pillow keeps them, without a copy.

Pillow (11.2 and later) exports an image through the Arrow C data interface
(``__arrow_c_array__``): an RGB image as one item per pixel, a fixed-size list of 4
uint8 (R, G, B and a padding byte, as Pillow stores every RGB pixel), where the image
lies in one block of memory (server/serving/image_decode.py sizes Pillow's blocks so
that every image it decodes does). The interface's structs are a stable ABI, read here
with ctypes; the exported memory lives as long as the capsule that holds it, which the
returned array keeps.
"""

from __future__ import annotations

import ctypes

import numpy as np
import PIL.Image


class _ArrowSchema(ctypes.Structure):
    pass


_ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p),
    ("name", ctypes.c_char_p),
    ("metadata", ctypes.c_char_p),
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowSchema))),
    ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
]


class _ArrowArray(ctypes.Structure):
    pass


_ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))),
    ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
]

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def rgbx_pixels(image: PIL.Image.Image) -> np.ndarray | None:
    """An RGB image's pixels as uint8 [height, width, 4] on Pillow's own memory (R, G,
    B, padding), or None where Pillow exports none (an older Pillow, an image in several
    blocks) or not in that layout."""
    if image.mode != "RGB" or not hasattr(image, "__arrow_c_array__"):
        return None
    try:
        schema_capsule, array_capsule = image.__arrow_c_array__()
    except ValueError:  # "Image rows are not contiguous in memory": several blocks
        return None
    schema = _ArrowSchema.from_address(_capsule_pointer(schema_capsule, b"arrow_schema"))
    array = _ArrowArray.from_address(_capsule_pointer(array_capsule, b"arrow_array"))
    width, height = image.size
    if not (
        schema.format == b"+w:4"
        and schema.n_children == 1
        and schema.children[0].contents.format == b"C"
        and array.length == width * height
        and array.offset == 0
        and array.n_children == 1
    ):
        return None
    values = array.children[0].contents
    if values.offset != 0 or values.n_buffers != 2 or values.length != 4 * width * height:
        return None
    memory = (ctypes.c_uint8 * values.length).from_address(values.buffers[1])
    memory.keep_alive = (schema_capsule, array_capsule)  # the export lives while these do
    return np.frombuffer(memory, dtype=np.uint8).reshape(height, width, 4)
