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

static const spconv_layer_desc second_layers[] = {
    SPCONV__ZOO_SUBM("conv_input.0", 4, 16, 3, "subm1"),
    SPCONV__ZOO_BN("conv_input.1", 16),
    SPCONV__ZOO_RELU("conv_input.2"),
    SPCONV__ZOO_SUBM_BLOCK("conv1.0", 16, 16, "subm1"),
    SPCONV__ZOO_DOWN_BLOCK("conv2.0", 16, 32, 1, "spconv2"),
    SPCONV__ZOO_SUBM_BLOCK("conv2.1", 32, 32, "subm2"),
    SPCONV__ZOO_SUBM_BLOCK("conv2.2", 32, 32, "subm2"),
    SPCONV__ZOO_DOWN_BLOCK("conv3.0", 32, 64, 1, "spconv3"),
    SPCONV__ZOO_SUBM_BLOCK("conv3.1", 64, 64, "subm3"),
    SPCONV__ZOO_SUBM_BLOCK("conv3.2", 64, 64, "subm3"),
    SPCONV__ZOO_DOWN_BLOCK("conv4.0", 64, 64, 0, "spconv4"),
    SPCONV__ZOO_SUBM_BLOCK("conv4.1", 64, 64, "subm4"),
    SPCONV__ZOO_SUBM_BLOCK("conv4.2", 64, 64, "subm4"),
    {.kind = SPCONV_LAYER_CONV, .name = "conv_out.0", .in_channels = 64, .out_channels = 128,
     .kernel = {3, 1, 1}, .stride = {2, 1, 1}, .key = "spconv_down2"},
    SPCONV__ZOO_BN("conv_out.1", 128),
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
    .input = SPCONV__ZOO_KITTI_INPUT,
    .layers = second_layers,
    .num_layers = (int)(sizeof second_layers / sizeof second_layers[0]),
};
