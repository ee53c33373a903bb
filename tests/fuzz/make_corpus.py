#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<reader>/): a few small, valid
files of each format, made here from scratch, so that the fuzzers start from inputs that reach
deep into the readers. Run from anywhere: python3 tests/fuzz/make_corpus.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
POINTS = [(1.0, 2.0, 3.0, 0.5), (-4.5, 0.25, 1.0, 0.0), (7.0, -8.0, 0.5, 1.0)]


def write(reader, name, data):
    folder = os.path.join(HERE, "corpus", reader)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def floats(rows):
    return b"".join(struct.pack("<%df" % len(r), *r) for r in rows)


def lzf_literals(data):
    """An LZF stream of literal runs only (control byte n-1, then n <= 32 bytes): valid LZF."""
    out = b""
    for i in range(0, len(data), 32):
        chunk = data[i:i + 32]
        out += bytes([len(chunk) - 1]) + chunk
    return out


def pcd_header(fields, sizes, types, counts, points, data, width=None, height=1):
    width = points if width is None else width
    return ("# .PCD v0.7\nVERSION 0.7\nFIELDS %s\nSIZE %s\nTYPE %s\nCOUNT %s\nWIDTH %d\n"
            "HEIGHT %d\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS %d\nDATA %s\n" % (
                " ".join(fields), " ".join(map(str, sizes)), " ".join(types),
                " ".join(map(str, counts)), width, height, points, data)).encode()


def make_pcd():
    xyzi = (["x", "y", "z", "intensity"], [4] * 4, ["F"] * 4, [1] * 4)
    write("pcd", "ascii.pcd", pcd_header(*xyzi, 3, "ascii") +
          "".join("%g %g %g %g\n" % p for p in POINTS).encode())
    write("pcd", "binary.pcd", pcd_header(*xyzi, 3, "binary") + floats(POINTS))
    # binary_compressed stores each field's values together, then LZF
    soa = b"".join(struct.pack("<3f", *[p[k] for p in POINTS]) for k in range(4))
    block = lzf_literals(soa)
    write("pcd", "compressed.pcd", pcd_header(*xyzi, 3, "binary_compressed") +
          struct.pack("<II", len(block), len(soa)) + block)
    mixed = (["x", "y", "z", "rgb", "ring", "_", "normal"], [4, 8, 4, 4, 2, 1, 4],
             ["F", "F", "F", "U", "U", "U", "F"], [1, 1, 1, 1, 1, 2, 3])
    rows = b"".join(struct.pack("<fdfIH2B3f", p[0], p[1], p[2], 0x00FF8040, i, 0, 0, 0, 0, 1)
                    for i, p in enumerate(POINTS))
    write("pcd", "mixed_types.pcd", pcd_header(*mixed, 3, "binary") + rows)
    nan = float("nan")
    organized = POINTS + [(nan, nan, nan, 0.0)]
    write("pcd", "organized.pcd", pcd_header(*xyzi, 4, "binary", width=2, height=2) +
          floats(organized))


def ply_header(fmt, vertices, props, faces=0):
    text = "ply\nformat %s 1.0\ncomment seed\nelement vertex %d\n" % (fmt, vertices)
    text += "".join("property %s %s\n" % p for p in props)
    if faces:
        text += "element face %d\nproperty list uchar int vertex_indices\n" % faces
    return (text + "end_header\n").encode()


def make_ply():
    props = [("float", "x"), ("float", "y"), ("float", "z"), ("float", "intensity")]
    write("ply", "ascii.ply", ply_header("ascii", 3, props, faces=1) +
          "".join("%g %g %g %g\n" % p for p in POINTS).encode() + b"3 0 1 2\n")
    write("ply", "binary_le.ply", ply_header("binary_little_endian", 3, props, faces=1) +
          floats(POINTS) + struct.pack("<B3i", 3, 0, 1, 2))
    write("ply", "binary_be.ply", ply_header("binary_big_endian", 3, props) +
          b"".join(struct.pack(">4f", *p) for p in POINTS))
    colour = [("double", "x"), ("double", "y"), ("double", "z"), ("uchar", "red"),
              ("uchar", "green"), ("uchar", "blue")]
    write("ply", "colour.ply", ply_header("binary_little_endian", 3, colour) +
          b"".join(struct.pack("<3d3B", p[0], p[1], p[2], 10, 20, 30) for p in POINTS))


def make_bin():
    # the targets take one leading byte that picks the column count (0: from the name)
    write("bin", "kitti.bin", b"\x04" + floats(POINTS))
    write("bin", "from_name.bin", b"\x00" + floats([p + (5.0,) for p in POINTS]))
    write("bin", "truncated.bin", b"\x04" + floats(POINTS)[:-3])


def npy(descr, shape, payload):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pad = 64 - (10 + len(header) + 1) % 64
    header = (header + " " * (pad % 64) + "\n").encode()
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload


def make_npy():
    write("npy", "f32.npy", npy("<f4", "(3, 4)", floats(POINTS)))
    write("npy", "i32.npy", npy("<i4", "(2, 4)", struct.pack("<8i", 0, 1, 2, 3, 0, 4, 5, 6)))
    write("npy", "f64_1d.npy", npy("<f8", "(3,)", struct.pack("<3d", 1.0, 2.0, 3.0)))
    write("npy", "scalar.npy", npy("<i8", "()", struct.pack("<q", 42)))


if __name__ == "__main__":
    make_pcd()
    make_ply()
    make_bin()
    make_npy()
