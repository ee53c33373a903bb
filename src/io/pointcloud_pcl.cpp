// The PCL shim: PCD and PLY files read by PCL's I/O module into pcl::PCLPointCloud2, handed to C
// as raw records plus field descriptions. No C++ exception crosses the C interface.
#include "io/pointcloud_pcl.h"

#include <pcl/PCLPointCloud2.h>
#include <pcl/io/pcd_io.h>
#include <pcl/io/ply_io.h>

#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/error.h"

namespace {

// What the shim hands out: the cloud and the C view of its fields, freed together.
struct PclCloud {
    pcl::PCLPointCloud2 cloud;
    std::vector<spconv__raw_field> fields;
};

bool to_scalar(std::uint8_t datatype, spconv__scalar *out) {
    switch (datatype) {
    case pcl::PCLPointField::BOOL: *out = SPCONV__BOOL; return sizeof(bool) == 1;
    case pcl::PCLPointField::INT8: *out = SPCONV__I8; return true;
    case pcl::PCLPointField::UINT8: *out = SPCONV__U8; return true;
    case pcl::PCLPointField::INT16: *out = SPCONV__I16; return true;
    case pcl::PCLPointField::UINT16: *out = SPCONV__U16; return true;
    case pcl::PCLPointField::INT32: *out = SPCONV__I32; return true;
    case pcl::PCLPointField::UINT32: *out = SPCONV__U32; return true;
    case pcl::PCLPointField::INT64: *out = SPCONV__I64; return true;
    case pcl::PCLPointField::UINT64: *out = SPCONV__U64; return true;
    case pcl::PCLPointField::FLOAT32: *out = SPCONV__F32; return true;
    case pcl::PCLPointField::FLOAT64: *out = SPCONV__F64; return true;
    default: return false;
    }
}

int read_file(const std::string &path, spconv_cloud_format format, pcl::PCLPointCloud2 &cloud) {
    Eigen::Vector4f origin;
    Eigen::Quaternionf orientation;
    int version = 0;
    if (format == SPCONV_CLOUD_PCD) {
        pcl::PCDReader reader;
        return reader.read(path, cloud, origin, orientation, version);
    }
    pcl::PLYReader reader;
    return reader.read(path, cloud, origin, orientation, version);
}

spconv_status describe(const char *func, const char *path, PclCloud &holder,
                       spconv__raw_cloud *out) {
    const pcl::PCLPointCloud2 &cloud = holder.cloud;
    if (cloud.is_bigendian)
        return spconv__error(SPCONV_ERR_NOT_SUPPORTED,
                             "%s: PCL returned '%s' with big-endian records", func, path);
    holder.fields.reserve(cloud.fields.size());
    for (const pcl::PCLPointField &f : cloud.fields) {
        spconv__raw_field field{f.name.c_str(), SPCONV__F32, f.offset, f.count};
        if (!to_scalar(f.datatype, &field.type))
            return spconv__error(SPCONV_ERR_FORMAT, "%s: '%s': field '%s' has PCL datatype %d, "
                                 "which is not a number", func, path, f.name.c_str(),
                                 static_cast<int>(f.datatype));
        holder.fields.push_back(field);
    }
    out->data = cloud.data.data();
    out->data_bytes = cloud.data.size();
    out->width = cloud.width;
    out->height = cloud.height;
    out->point_step = cloud.point_step;
    out->fields = holder.fields.data();
    out->num_fields = holder.fields.size();
    return SPCONV_OK;
}

} // namespace

extern "C" spconv_status spconv__pcl_read(const char *func, const char *path,
                                          spconv_cloud_format format, spconv__raw_cloud *out) {
    *out = spconv__raw_cloud{};
    const char *kind = format == SPCONV_CLOUD_PCD ? "PCD" : "PLY";
    try {
        auto holder = std::make_unique<PclCloud>();
        int rc = read_file(path, format, holder->cloud);
        if (rc != 0)
            return spconv__error(SPCONV_ERR_FORMAT, "%s: PCL's %s reader rejected '%s' (code %d)",
                                 func, kind, path, rc);
        spconv_status st = describe(func, path, *holder, out);
        if (st != SPCONV_OK) {
            *out = spconv__raw_cloud{};
            return st;
        }
        out->owner = holder.release();
        return SPCONV_OK;
    } catch (const std::bad_alloc &) {
        *out = spconv__raw_cloud{};
        return spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory while PCL read '%s'",
                             func, path);
    } catch (const std::exception &e) {
        *out = spconv__raw_cloud{};
        return spconv__error(SPCONV_ERR_FORMAT, "%s: PCL's %s reader failed on '%s': %s", func,
                             kind, path, e.what());
    } catch (...) {
        *out = spconv__raw_cloud{};
        return spconv__error(SPCONV_ERR_FORMAT, "%s: PCL's %s reader failed on '%s'", func, kind,
                             path);
    }
}

extern "C" void spconv__pcl_free(spconv__raw_cloud *cloud) {
    delete static_cast<PclCloud *>(cloud->owner);
    *cloud = spconv__raw_cloud{};
}
