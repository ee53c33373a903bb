"""spconv 2.x-compatible modules on the spconv-c engine: ``import spconv_c.pytorch as spconv``."""

from .conv import (SparseConv1d, SparseConv2d, SparseConv3d, SparseConv4d, SparseConvolution,
                   SparseConvTranspose1d, SparseConvTranspose2d, SparseConvTranspose3d,
                   SparseConvTranspose4d, SparseInverseConv1d, SparseInverseConv2d,
                   SparseInverseConv3d, SparseInverseConv4d, SubMConv1d, SubMConv2d,
                   SubMConv3d, SubMConv4d)
from .core import ConvAlgo, SparseConvTensor
from .modules import (Identity, RemoveGrid, SparseBatchNorm, SparseIdentity, SparseModule,
                      SparseReLU, SparseSequential, SparseSyncBatchNorm, ToDense,
                      assign_name_for_sparse_modules, is_spconv_module)
from .pool import (SparseAvgPool, SparseAvgPool1d, SparseAvgPool2d, SparseAvgPool3d,
                   SparseGlobalAvgPool, SparseGlobalMaxPool, SparseMaxPool, SparseMaxPool1d,
                   SparseMaxPool2d, SparseMaxPool3d, SparseMaxPool4d)
from .tables import AddTable, AddTableMisaligned, ConcatTable, JoinTable
from .utils import PointToVoxel, gather_features_by_pc_voxel_id  # noqa: F401
from . import conv, core, functional, hash, modules, pool, tables, utils  # noqa: F401

__all__ = ["ConvAlgo", "SparseConvTensor", "SparseModule", "SparseSequential",
           "SparseConvolution", "SparseConv1d", "SparseConv2d", "SparseConv3d", "SubMConv1d",
           "SubMConv2d", "SubMConv3d", "SparseConvTranspose1d", "SparseConvTranspose2d",
           "SparseConvTranspose3d", "SparseInverseConv1d", "SparseInverseConv2d",
           "SparseInverseConv3d", "SparseMaxPool", "SparseMaxPool1d", "SparseMaxPool2d",
           "SparseMaxPool3d", "SparseAvgPool", "SparseAvgPool1d", "SparseAvgPool2d",
           "SparseAvgPool3d", "SparseGlobalMaxPool", "SparseGlobalAvgPool", "JoinTable",
           "AddTable", "AddTableMisaligned", "ConcatTable", "ToDense", "RemoveGrid",
           "PointToVoxel", "SparseBatchNorm", "SparseSyncBatchNorm", "SparseReLU",
           "SparseIdentity"]
