// The PCL shim: binary PCD data parsed by PCL's PCD reader into pcl::PCLPointCloud2, handed to C
// as raw records plus field descriptions. No C++ exception crosses the C interface, and PCL never
// opens a file: it gets the bytes the C side read once and checked.
#include "io/pointcloud_pcl.h"

#include <pcl/PCLPointCloud2.h>
#include <pcl/console/print.h>
#include <pcl/io/pcd_io.h>

#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
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

// PCL reports its failures on stderr through its console; the library reports them as its own
// one-line message, so PCL is silenced while it works. The level is PCL's process-wide state (the
// host program may have set it), so it is restored when the last of any concurrent readers is
// done: the first one in saves it, the last one out puts it back, under one lock.
std::mutex quiet_mutex;
int quiet_readers = 0;
pcl::console::VERBOSITY_LEVEL quiet_saved_level = pcl::console::L_INFO;

class QuietConsole {
  public:
    QuietConsole() {
        std::lock_guard<std::mutex> lock(quiet_mutex);
        if (quiet_readers++ == 0) {
            quiet_saved_level = pcl::console::getVerbosityLevel();
            pcl::console::setVerbosityLevel(pcl::console::L_ALWAYS);
        }
    }
    ~QuietConsole() {
        std::lock_guard<std::mutex> lock(quiet_mutex);
        if (--quiet_readers == 0) pcl::console::setVerbosityLevel(quiet_saved_level);
    }
    QuietConsole(const QuietConsole &) = delete;
    QuietConsole &operator=(const QuietConsole &) = delete;
};

// The header from a stream over its own bytes, the body from the buffer: PCL's readHeader and
// readBodyBinary are the two halves of PCDReader::read(path) without its open and mmap of the
// path. The caller checked the header and that the buffer holds all the data it announces.
int read_pcd(const char *text, std::size_t len, std::uint64_t data_offset,
             pcl::PCLPointCloud2 &cloud, std::string &why) {
    std::istringstream header(std::string(text, static_cast<std::size_t>(data_offset)));
    Eigen::Vector4f origin;
    Eigen::Quaternionf orientation;
    int version = 0, data_type = 0;
    unsigned int data_idx = 0;
    pcl::PCDReader reader;
    int rc = reader.readHeader(header, cloud, origin, orientation, version, data_type, data_idx);
    if (rc != 0) {
        why = "rejected its header";
        return rc;
    }
    if (data_type == 0 || data_idx != data_offset || data_offset > len) {
        why = "read its header differently (data type " + std::to_string(data_type) + " at byte " +
              std::to_string(data_idx) + ")";
        return -1;
    }
    rc = reader.readBodyBinary(reinterpret_cast<const unsigned char *>(text), cloud, version,
                               data_type == 2, data_idx);
    if (rc != 0) why = "rejected its data";
    return rc;
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

extern "C" spconv_status spconv__pcl_read_pcd(const char *func, const char *path,
                                              const char *text, size_t len, uint64_t data_offset,
                                              spconv__raw_cloud *out) {
    *out = spconv__raw_cloud{};
    try {
        QuietConsole quiet;
        auto holder = std::make_unique<PclCloud>();
        std::string why;
        int rc = read_pcd(text, len, data_offset, holder->cloud, why);
        if (rc != 0)
            return spconv__error(SPCONV_ERR_FORMAT, "%s: PCL's PCD reader %s of '%s' (code %d)",
                                 func, why.c_str(), path, rc);
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
        return spconv__error(SPCONV_ERR_FORMAT, "%s: PCL's PCD reader failed on '%s': %s", func,
                             path, e.what());
    } catch (...) {
        *out = spconv__raw_cloud{};
        return spconv__error(SPCONV_ERR_FORMAT, "%s: PCL's PCD reader failed on '%s'", func, path);
    }
}

extern "C" void spconv__pcl_free(spconv__raw_cloud *cloud) {
    delete static_cast<PclCloud *>(cloud->owner);
    *cloud = spconv__raw_cloud{};
}
