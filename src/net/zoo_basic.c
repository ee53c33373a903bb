/* "basic": spconv's own network benchmark, bench_basic (spconv/benchmark/basic.py): fourteen
 * SubMConv3d 3x3x3 without bias, in pairs sharing an indice_key per resolution, with a
 * SparseMaxPool3d(kernel 2, stride 2) between the pairs. Channels 3 -> 64, 64, then pairs of 96,
 * 128, 160, 192, 224, 256. No batch norm, no ReLU: it measures the convolutions. On spconv's
 * benchmark voxels, spatial shape [80, 1600, 1600] pools down to [1, 25, 25].
 *
 * Layer names follow the SparseSequential attribute "net": "net.0" .. "net.19". */
#include "net/zoo.h"

#define SUBM(nm, cin, cout, key_) SPCONV__ZOO_SUBM(nm, cin, cout, 3, key_)
#define POOL(nm, key_)                                                                             \
    {.kind = SPCONV_LAYER_MAXPOOL, .name = (nm), .kernel = {2, 2, 2}, .stride = {2, 2, 2},         \
     .key = (key_)}

static const spconv_layer_desc basic_layers[] = {
    SUBM("net.0", 3, 64, "c0"),      SUBM("net.1", 64, 64, "c0"),   POOL("net.2", NULL),
    SUBM("net.3", 64, 96, "c1"),     SUBM("net.4", 96, 96, "c1"),   POOL("net.5", NULL),
    SUBM("net.6", 96, 128, "c2"),    SUBM("net.7", 128, 128, "c2"), POOL("net.8", NULL),
    SUBM("net.9", 128, 160, "c3"),   SUBM("net.10", 160, 160, "c3"), POOL("net.11", NULL),
    SUBM("net.12", 160, 192, "c4"),  SUBM("net.13", 192, 192, "c4"), POOL("net.14", "m4"),
    SUBM("net.15", 192, 224, "c5"),  SUBM("net.16", 224, 224, "c5"), POOL("net.17", "m5"),
    SUBM("net.18", 224, 256, "c6"),  SUBM("net.19", 256, 256, "c6"),
};

/* The voxels of bench_basic come from spconv's Point2VoxelCPU3d with 0.1 m voxels over
 * [-80, 80] x [-80, 80] x [-2, 6], the x, y, z of one point per voxel, at most 150000 voxels. */
const spconv__zoo_entry spconv__zoo_basic = {
    .name = "basic",
    .summary = "spconv's bench_basic: 14 SubMConv3d 3x3x3 (3 -> 64 ... 256) and 6 "
               "SparseMaxPool3d(2, 2), sparse output",
    .input = {.channels = 3,
              .point_columns = 3,
              .voxel_size = {0.1, 0.1, 0.1},
              .point_range = {-80.0, -80.0, -2.0, 80.0, 80.0, 6.0},
              .grid_size = {1600, 1600, 80},
              .spatial_shape = {80, 1600, 1600},
              .max_points_per_voxel = 1,
              .max_voxels = 150000},
    .layers = basic_layers,
    .num_layers = (int)(sizeof basic_layers / sizeof basic_layers[0]),
};
