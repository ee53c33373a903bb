#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<reader>/): a few small, valid
files of each format, made here from scratch, so that the fuzzers start from inputs that reach
deep into the readers, and the edge cases each reader must refuse cleanly (PLY list properties in
every element, ASCII PCD and PLY values that do not parse or fit, short and long lines). Inputs
that once crashed a reader are kept beside them as regress_* files; this script does not touch
those. Run from anywhere: python3 tests/fuzz/make_corpus.py"""
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
    make_pcd_ascii(xyzi)


def make_pcd_ascii(xyzi):
    """ASCII data: each value must parse as its TYPE and fit its SIZE, each line hold exactly the
    values of a point; seeds on both sides of each rule."""
    def ascii(name, header_fields, lines, points=None):
        points = len(lines) if points is None else points
        write("pcd", "ascii_" + name + ".pcd", pcd_header(*header_fields, points, "ascii") +
              "".join(line + "\n" for line in lines).encode())
    ascii("garbage", xyzi, ["1 2 3 4", "1 abc 3 4", "1 2x 3 4"])
    ascii("short_line", xyzi, ["1000 2000 3000 4", "1 2 3", "5000 6000 7000 8"])
    ascii("long_line", xyzi, ["1 2 3 4 5", "1 2 3 4"])
    ascii("blank_lines", xyzi, ["1 2 3 4", "", "  \t\r", "5 6 7 8"], points=2)
    ascii("fewer_lines", xyzi, ["1000000 2000000 3000000 4"], points=3)
    ascii("more_lines", xyzi, ["1 2 3 4", "5 6 7 8", "9 10 11 12"], points=2)
    ascii("nan", xyzi, ["nan 2 3 4", "1 NaN 3 4", "1 2 3 nan", "inf -inf 3 4"])
    ascii("float_range", xyzi, ["1e39 2 3 4", "1 -3.5e38 3 4", "1e-50 2 3 0x1p3"])
    ints = (["x", "y", "z", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f8", "b"],
            [4, 4, 4, 1, 1, 2, 2, 4, 4, 8, 8, 8, 1],
            ["F", "F", "F", "I", "U", "I", "U", "I", "U", "I", "U", "F", "B"], [1] * 13)
    ascii("int_limits", ints, [
        "1 2 3 -128 255 -32768 65535 -2147483648 4294967295 -9223372036854775808 "
        "18446744073709551615 1e308 1",
        "1 2 3 127 0 32767 0 2147483647 0 9223372036854775807 0 -1e308 0"])
    ascii("int_out_of_range", ints, [
        "1 2 3 300 256 32768 65536 2147483648 4294967296 9223372036854775808 "
        "18446744073709551616 1e309 2",
        "1 2 3 -129 -1 -32769 -1 -2147483649 -1 -9223372036854775809 -1 nan 1"])
    ascii("int_not_integer", ints, ["1 2 3 1.5 +7 0x10 07 -0 1e3 nan inf 0.5 true"])
    counts = (["x", "y", "z", "normal", "h"], [4, 4, 4, 4, 8], ["F", "F", "F", "F", "U"],
              [1, 1, 1, 3, 2])
    ascii("counts", counts, ["10.5 20.5 30.5 0 0 1 5 6", "1 2 3 0 1 7 8"])
    huge = (["x", "y", "z", "h"], [4, 4, 4, 1], ["F", "F", "F", "U"], [1, 1, 1, 1048576])
    ascii("huge_count", huge, ["1 2 3 " + "0 " * 20], points=1)
    write("pcd", "ascii_huge_points.pcd",
          pcd_header(*xyzi, 2147483647, "ascii") + b"1 2 3 4\n")


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
    make_ply_lists()
    make_ply_ascii_values()


LIST_COUNT_TYPES = [("uchar", "B"), ("ushort", "H"), ("uint", "I"), ("char", "b"),
                    ("short", "h"), ("int", "i")]


def make_ply_lists():
    """List properties in every element: the vertex element (refused: a point is a fixed set of
    values, and PCL asserted on such lists), faces, elements of their own before and after the
    vertices, with every count type, in ascii and both binary byte orders."""
    xyz = "property float x\nproperty float y\nproperty float z\n"
    for count, _ in [("uint", "I"), ("uchar", "B"), ("ushort", "H")]:
        head = ("ply\nformat ascii 1.0\nelement vertex 2\n%sproperty list %s float foo\n"
                "end_header\n" % (xyz, count))
        write("ply", "vertex_list_%s.ply" % count, head.encode() + b"1 2 3 2 0.5 0.5\n4 5 6 1 1\n")
    head = ("ply\nformat binary_little_endian 1.0\nelement vertex 2\nproperty list uchar int foo\n"
            "%send_header\n" % xyz)
    write("ply", "vertex_list_binary.ply", head.encode() + struct.pack("<B i3f", 1, 7, 1, 2, 3) +
          struct.pack("<B 3i3f", 3, 7, 8, 9, 4, 5, 6))
    for order, tag in (("<", "little"), (">", "big")):
        for name, code in LIST_COUNT_TYPES:
            head = ("ply\nformat binary_%s_endian 1.0\nelement before 1\n"
                    "property list %s short a\nelement vertex 3\n%s"
                    "element face 1\nproperty list %s int vertex_indices\nproperty uchar flags\n"
                    "element after 2\nproperty list %s double b\nproperty float c\nend_header\n"
                    % (tag, name, xyz, name, name))
            body = struct.pack(order + code + "2h", 2, -1, 1)
            body += b"".join(struct.pack(order + "3f", *p[:3]) for p in POINTS)
            body += struct.pack(order + code + "3iB", 3, 0, 1, 2, 9)
            body += struct.pack(order + code + "f", 0, 0.5)
            body += struct.pack(order + code + "2df", 2, 1.5, -2.5, 1.0)
            write("ply", "lists_%s_%s.ply" % (tag, name), head.encode() + body)
    head = ("ply\nformat ascii 1.0\n obj_info indented\nelement vertex 3\n%s"
            "element face 2\nproperty list uchar int vertex_indices\n"
            "element camera 1\nproperty list ushort float k\nproperty float f\n"
            "element range_grid 1\nproperty list uchar int vertex_indices\nend_header\n" % xyz)
    body = "".join("%g %g %g\n" % p[:3] for p in POINTS) + "3 0 1 2\n0\n2 1 2 0.5\n1 0\n"
    write("ply", "lists_ascii.ply", (head + body).encode())


def make_ply_ascii_values():
    """ASCII rows: values that do not parse or fit their type, rows short or long, rows missing
    or left over."""
    head = ("ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\n"
            "property float z\nproperty char c\nproperty uchar red\nproperty ushort s\n"
            "property uint u\nproperty double d\nend_header\n")
    rows = {
        "limits": "1 2 3 -128 255 65535 4294967295 1e308\n1 2 3 127 0 0 0 -1e308\n",
        "out_of_range": "1 2 3 300 256 65536 4294967296 1e309\n1 2 3 -129 -1 -1 -1 nan\n",
        "garbage": "1 abc 3 0 0 0 0 0\n1 2 3 1.5 0x1 +1 -0 inf\n",
        "short_row": "1000 2000 3000 0 0 0 0\n1 2 3 0 0 0 0 0\n",
        "long_row": "1 2 3 0 0 0 0 0 9\n1 2 3 0 0 0 0 0\n",
        "missing_row": "1000000 2000000 3000000 0 0 0 0 0\n",
        "extra_row": "1 2 3 0 0 0 0 0\n1 2 3 0 0 0 0 0\n1 2 3 0 0 0 0 0\n",
    }
    for name, body in rows.items():
        write("ply", "ascii_%s.ply" % name, (head + body).encode())


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
