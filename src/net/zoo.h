/* The model zoo: each network is a table of layers in its own file, registered in zoo.c. */
#ifndef SPCONV_NET_ZOO_H
#define SPCONV_NET_ZOO_H

#include "spconv/net.h"

typedef struct spconv__zoo_entry {
    const char *name;
    const char *summary;
    spconv_net_input input;
    const spconv_layer_desc *layers;
    int num_layers;
} spconv__zoo_entry;

extern const spconv__zoo_entry spconv__zoo_second;
extern const spconv__zoo_entry spconv__zoo_basic;
extern const spconv__zoo_entry spconv__zoo_unet;

/* Layer shorthands for the tables (designated initializers; unnamed fields take defaults). */
#define SPCONV__ZOO_SUBM(nm, cin, cout, k, key_)                                                   \
    {.kind = SPCONV_LAYER_SUBM, .name = (nm), .in_channels = (cin), .out_channels = (cout),        \
     .kernel = {(k), (k), (k)}, .key = (key_)}
#define SPCONV__ZOO_RELU(nm) {.kind = SPCONV_LAYER_RELU, .name = (nm)}

/* OpenPCDet's BatchNorm1d(eps 1e-3, momentum 0.01). */
#define SPCONV__ZOO_BN(nm, c)                                                                      \
    {.kind = SPCONV_LAYER_BATCHNORM, .name = (nm), .in_channels = (c), .eps = 1e-3,                \
     .momentum = 0.01}

/* OpenPCDet's post_act_block with conv_type 'subm': SubMConv3d 3x3x3, BN, ReLU. */
#define SPCONV__ZOO_SUBM_BLOCK(prefix, cin, cout, key_)                                            \
    SPCONV__ZOO_SUBM(prefix ".0", cin, cout, 3, key_), SPCONV__ZOO_BN(prefix ".1", cout),          \
        SPCONV__ZOO_RELU(prefix ".2")

/* OpenPCDet's post_act_block with conv_type 'spconv': SparseConv3d 3x3x3 stride 2 with padding
 * (pad_z, 1, 1), BN, ReLU. */
#define SPCONV__ZOO_DOWN_BLOCK(prefix, cin, cout, pad_z, key_)                                     \
    {.kind = SPCONV_LAYER_CONV, .name = prefix ".0", .in_channels = (cin),                         \
     .out_channels = (cout), .kernel = {3, 3, 3}, .stride = {2, 2, 2},                             \
     .padding = {(pad_z), 1, 1}, .key = (key_)},                                                   \
        SPCONV__ZOO_BN(prefix ".1", cout), SPCONV__ZOO_RELU(prefix ".2")

/* The KITTI settings of OpenPCDet's SECOND config (see zoo_second.c), shared by the networks
 * that run on the same input. */
#define SPCONV__ZOO_KITTI_INPUT                                                                    \
    {.channels = 4,                                                                                \
     .point_columns = 4,                                                                           \
     .voxel_size = {0.05, 0.05, 0.1},                                                              \
     .point_range = {0.0, -40.0, -3.0, 70.4, 40.0, 1.0},                                           \
     .grid_size = {1408, 1600, 40},                                                                \
     .spatial_shape = {41, 1600, 1408},                                                            \
     .max_points_per_voxel = 5,                                                                    \
     .max_voxels = 40000}

#endif /* SPCONV_NET_ZOO_H */
