/* "second": OpenPCDet's VoxelBackBone8x, the sparse backbone of SECOND, on the KITTI grid.
 *
 * Layer names are OpenPCDet's module paths (conv2.0.0 is block 0 of conv2, its conv; .1 the
 * batch norm; .2 the ReLU), so a VoxelBackBone8x state dict with the "backbone_3d." prefix
 * dropped loads by name. Geometry per OpenPCDet (pcdet/models/backbones_3d/spconv_backbone.py):
 * submanifold 3x3x3 convs without bias, stride-2 3x3x3 sparse convs with padding 1 (conv4 pads
 * (0, 1, 1)), a final (3, 1, 1) conv with stride (2, 1, 1) and no padding, and after every conv
 * BatchNorm1d(eps 1e-3, momentum 0.01) and ReLU. Spatial shapes (z, y, x):
 * [41, 1600, 1408] -> [21, 800, 704] -> [11, 400, 352] -> [5, 200, 176] -> [2, 200, 176], then
 * HeightCompression folds the 2 height slices into the channels: [B, 256, 200, 176]. */
#include "net/zoo.h"

#define BN(nm, c)                                                                                  \
    {.kind = SPCONV_LAYER_BATCHNORM, .name = (nm), .in_channels = (c), .eps = 1e-3,                \
     .momentum = 0.01}

/* post_act_block with conv_type 'subm': SubMConv3d, BN, ReLU. */
#define SUBM_BLOCK(prefix, cin, cout, key_)                                                        \
    SPCONV__ZOO_SUBM(prefix ".0", cin, cout, 3, key_), BN(prefix ".1", cout),                      \
        SPCONV__ZOO_RELU(prefix ".2")

/* post_act_block with conv_type 'spconv': SparseConv3d 3x3x3 stride 2, BN, ReLU. */
#define DOWN_BLOCK(prefix, cin, cout, pad_z, key_)                                                 \
    {.kind = SPCONV_LAYER_CONV, .name = prefix ".0", .in_channels = (cin),                         \
     .out_channels = (cout), .kernel = {3, 3, 3}, .stride = {2, 2, 2},                             \
     .padding = {(pad_z), 1, 1}, .key = (key_)},                                                   \
        BN(prefix ".1", cout), SPCONV__ZOO_RELU(prefix ".2")

static const spconv_layer_desc second_layers[] = {
    SPCONV__ZOO_SUBM("conv_input.0", 4, 16, 3, "subm1"),
    BN("conv_input.1", 16),
    SPCONV__ZOO_RELU("conv_input.2"),
    SUBM_BLOCK("conv1.0", 16, 16, "subm1"),
    DOWN_BLOCK("conv2.0", 16, 32, 1, "spconv2"),
    SUBM_BLOCK("conv2.1", 32, 32, "subm2"),
    SUBM_BLOCK("conv2.2", 32, 32, "subm2"),
    DOWN_BLOCK("conv3.0", 32, 64, 1, "spconv3"),
    SUBM_BLOCK("conv3.1", 64, 64, "subm3"),
    SUBM_BLOCK("conv3.2", 64, 64, "subm3"),
    DOWN_BLOCK("conv4.0", 64, 64, 0, "spconv4"),
    SUBM_BLOCK("conv4.1", 64, 64, "subm4"),
    SUBM_BLOCK("conv4.2", 64, 64, "subm4"),
    {.kind = SPCONV_LAYER_CONV, .name = "conv_out.0", .in_channels = 64, .out_channels = 128,
     .kernel = {3, 1, 1}, .stride = {2, 1, 1}, .key = "spconv_down2"},
    BN("conv_out.1", 128),
    SPCONV__ZOO_RELU("conv_out.2"),
    {.kind = SPCONV_LAYER_TO_DENSE, .name = "map_to_bev"},
};

/* KITTI settings of OpenPCDet's SECOND config: voxels 0.05 x 0.05 x 0.1 m over x in [0, 70.4],
 * y in [-40, 40], z in [-3, 1] give a grid of 1408 x 1600 x 40; the sparse shape adds 1 on z
 * (sparse_shape = grid_size[::-1] + [1, 0, 0]). MeanVFE over 5 points of x, y, z, intensity;
 * 40000 voxels at test time. */
const spconv__zoo_entry spconv__zoo_second = {
    .name = "second",
    .summary = "SECOND / OpenPCDet VoxelBackBone8x on the KITTI grid: 4 -> 128 channels, "
               "dense BEV map [B, 256, 200, 176]",
    .input = {.channels = 4,
              .point_columns = 4,
              .voxel_size = {0.05, 0.05, 0.1},
              .point_range = {0.0, -40.0, -3.0, 70.4, 40.0, 1.0},
              .grid_size = {1408, 1600, 40},
              .spatial_shape = {41, 1600, 1408},
              .max_points_per_voxel = 5,
              .max_voxels = 40000},
    .layers = second_layers,
    .num_layers = (int)(sizeof second_layers / sizeof second_layers[0]),
};
