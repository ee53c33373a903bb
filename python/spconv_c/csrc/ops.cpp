// The PyTorch operators of spconv_c: a thin layer over the C API (include/spconv/*.h).
//
// Every operator is registered with the dispatcher under the namespace `spconv_c` with its schema
// written out below (torch.ops.spconv_c.<name>). Tensors cross the boundary without copies:
//   - inputs are wrapped with spconv_tensor_wrap on the torch tensor's own memory; the wrap holds
//     a reference to the torch tensor (a heap at::Tensor released by the wrap's deleter), so the
//     memory outlives every engine object that views it (a rulebook keeps its indices);
//   - outputs of the engine become torch tensors with torch::from_blob over the engine's memory,
//     whose deleter releases the spconv tensor when the torch storage goes; a CUDA output whose
//     memory the caching allocator gave the engine (and that the engine holds no other reference
//     to) is handed back to torch as the allocator's own block instead (adopt_cuda_block), so
//     that Tensor.record_stream works on it.
// Engine failures become Python RuntimeErrors carrying spconv_last_error()'s message.
//
// A rulebook is an opaque handle (torch::class_ spconv_c.Rulebook) holding the C rulebook: the
// conv and pool ops take it as it is, so nothing is rebuilt or converted per layer, and the C
// library stays free to change its internal layout (it is doing so: per-offset counts are read in
// one helper, pair_range below). Its pairs and output indices are readable as tensors (views).

#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <exception>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "spconv/spconv.h"

namespace spconv_c {
namespace {

// ---- errors ----------------------------------------------------------------------------------

[[noreturn]] void engine_failure(spconv_status status, const char *what) {
    const char *detail = spconv_last_error();
    TORCH_CHECK(false, "spconv_c.", what, ": ", (detail && *detail) ? detail : "",
                " (", spconv_status_string(status), ")");
}

#define SPCONV_TRY(what, expr)                                                                   \
    do {                                                                                         \
        spconv_status spconv_try_status_ = (expr);                                               \
        if (spconv_try_status_ != SPCONV_OK) engine_failure(spconv_try_status_, what);           \
    } while (0)

// ---- per-offset counts: the one place that knows how the C rulebook stores them ----------------

// Pairs of kernel offset k are [*begin, *end) of the rulebook's pair lists.
// (An offset without pairs gives an empty range.)
void pair_range(const spconv_rulebook *rb, int64_t k, int64_t *begin, int64_t *end) {
    spconv_rulebook_offset_range(rb, k, begin, end);
}

// ---- devices, dtypes, contexts ---------------------------------------------------------------

spconv_dtype to_spconv_dtype(at::ScalarType t, const char *what) {
    switch (t) {
    case at::kHalf: return SPCONV_F16;
    case at::kBFloat16: return SPCONV_BF16;
    case at::kFloat: return SPCONV_F32;
    case at::kDouble: return SPCONV_F64;
    case at::kInt: return SPCONV_I32;
    case at::kLong: return SPCONV_I64;
    case at::kByte: return SPCONV_U8;
    default: TORCH_CHECK(false, "spconv_c: ", what, " has dtype ", t, ", which the engine has no type for");
    }
}

at::ScalarType to_torch_dtype(spconv_dtype t) {
    switch (t) {
    case SPCONV_F16: return at::kHalf;
    case SPCONV_BF16: return at::kBFloat16;
    case SPCONV_F32: return at::kFloat;
    case SPCONV_F64: return at::kDouble;
    case SPCONV_I32: return at::kInt;
    case SPCONV_I64: return at::kLong;
    case SPCONV_U8: return at::kByte;
    }
    TORCH_CHECK(false, "spconv_c: the engine returned an unknown dtype ", static_cast<int>(t));
}

spconv_device to_spconv_device(const at::Device &d, const char *what) {
    if (d.is_cpu()) return spconv_cpu();
    if (d.is_cuda()) return spconv_cuda(d.has_index() ? d.index() : 0);
    TORCH_CHECK(false, "spconv_c: ", what, " is on device ", d, "; the engine runs on cpu and cuda");
}

at::Device to_torch_device(spconv_device d) {
    if (d.type == SPCONV_DEVICE_CUDA) return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d.index));
    return at::Device(at::kCPU);
}

// CUDA memory of the engine from PyTorch's allocator for CUDA (the caching allocator), through
// the generic c10 interface, so the extension needs no CUDA headers: on the device of the call
// and, as the caching allocator does, for the current stream, which is the one the engine's work
// is queued on (DeviceScope). Its blocks are 512-byte aligned (the engine asks for 256). An
// allocation PyTorch cannot make (c10::OutOfMemoryError) is NULL here, which the engine reports
// as SPCONV_ERR_OUT_OF_MEMORY naming the hook.
void *torch_cuda_alloc(size_t nbytes, spconv_device device, void * /*user_data*/) {
    try {
        c10::DeviceGuard guard(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device.index)));
        return c10::GetAllocator(c10::DeviceType::CUDA)->raw_allocate(nbytes);
    } catch (const std::exception &) {
        return nullptr;
    }
}

// Called from C (a tensor's release): nothing may unwind through it, so a failure here (a c10
// error at teardown, or after a CUDA error) leaves the block to PyTorch instead.
void torch_cuda_free(void *ptr, size_t /*nbytes*/, spconv_device device, void * /*user_data*/) {
    try {
        c10::DeviceGuard guard(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device.index)));
        c10::GetAllocator(c10::DeviceType::CUDA)->raw_deallocate(ptr);
    } catch (const std::exception &) {
    }
}

// One engine context per thread and device (contexts are not thread-safe), created on first use.
// CPU ops run with PyTorch's intra-op thread count so that torch.set_num_threads governs both.
// CUDA contexts take their memory from PyTorch's allocator (above).
struct ThreadContexts {
    spconv_context *cpu = nullptr;
    std::vector<spconv_context *> cuda;
    ~ThreadContexts() {
        spconv_context_destroy(cpu);
        for (spconv_context *c : cuda) spconv_context_destroy(c);
    }
};

spconv_context *context_for(const at::Device &device) {
    thread_local ThreadContexts contexts;
    if (device.is_cpu()) {
        if (!contexts.cpu) SPCONV_TRY("context", spconv_context_create(spconv_cpu(), &contexts.cpu));
        SPCONV_TRY("context", spconv_context_set_num_threads(contexts.cpu, at::get_num_threads()));
        return contexts.cpu;
    }
    TORCH_CHECK(device.is_cuda(), "spconv_c: tensors on ", device, " are not supported (cpu, cuda)");
    size_t index = device.has_index() ? static_cast<size_t>(device.index()) : 0;
    if (contexts.cuda.size() <= index) contexts.cuda.resize(index + 1, nullptr);
    if (!contexts.cuda[index]) {
        spconv_context *ctx = nullptr;
        SPCONV_TRY("context (cuda)", spconv_context_create(spconv_cuda(static_cast<int>(index)), &ctx));
        spconv_status s = spconv_context_set_allocator(ctx, torch_cuda_alloc, torch_cuda_free, nullptr);
        if (s != SPCONV_OK) {
            spconv_context_destroy(ctx);
            engine_failure(s, "context (cuda allocator)");
        }
        contexts.cuda[index] = ctx;
    }
    return contexts.cuda[index];
}

// CUDA work goes on PyTorch's current stream of the tensors' device
// (spconv_context_set_cuda_stream, set again for every op, since torch.cuda.stream(...) may have
// changed it), so it is ordered with PyTorch's own work on that stream: no wait before or after.
// The legacy default stream (PyTorch's default, whose handle is 0) is cudaStreamLegacy for the
// engine. Where this PyTorch cannot give the stream's handle, the op falls back to waiting for the
// device before it starts and for the engine's own stream before it returns (correct, slower).
at::Device with_index(const at::Device &d) {
    if (!d.is_cuda() || d.has_index()) return d;
    return at::Device(at::kCUDA, c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice().index());
}

// The guard comes before the context, whose creation (cudaSetDevice) would otherwise change the
// caller's current device for good.
struct DeviceScope {
    at::Device device; // CUDA devices with their index (the current one where a tensor has none)
    c10::OptionalDeviceGuard guard;
    spconv_context *ctx;
    bool on_torch_stream = false;
    explicit DeviceScope(const at::Device &d)
        : device(with_index(d)),
          guard(device.is_cuda() ? c10::optional<at::Device>(device) : c10::optional<at::Device>()),
          ctx(context_for(device)) {
        if (!device.is_cuda()) return;
        const c10::impl::DeviceGuardImplInterface *impl = c10::impl::getDeviceGuardImpl(at::kCUDA);
        void *handle = nullptr;
        try {
            handle = impl->getStream(device).native_handle();
            on_torch_stream = true;
        } catch (const std::exception &) {
            on_torch_stream = false;
        }
        if (on_torch_stream) {
            SPCONV_TRY("cuda stream", spconv_context_set_cuda_stream(
                                          ctx, handle != nullptr ? handle : reinterpret_cast<void *>(0x1)));
        } else {
            impl->synchronizeDevice(device.index());
        }
    }
    void finish() {
        if (device.is_cuda() && !on_torch_stream)
            SPCONV_TRY("synchronize", spconv_context_synchronize(ctx));
    }
};

// ---- zero-copy wrapping ----------------------------------------------------------------------

// Owning pointer to an engine tensor (released on scope exit unless handed on).
struct Handle {
    spconv_tensor *t = nullptr;
    Handle() = default;
    explicit Handle(spconv_tensor *p) : t(p) {}
    Handle(const Handle &) = delete;
    Handle &operator=(const Handle &) = delete;
    Handle(Handle &&o) noexcept : t(o.t) { o.t = nullptr; }
    ~Handle() { spconv_tensor_release(t); }
    spconv_tensor *release() {
        spconv_tensor *p = t;
        t = nullptr;
        return p;
    }
};

void drop_torch_reference(void * /*data*/, void *user) { delete static_cast<at::Tensor *>(user); }

// An engine view of @p t's memory. The view holds a reference to @p t until the engine lets go.
Handle wrap(const at::Tensor &t, const char *what) {
    TORCH_CHECK(t.defined(), "spconv_c: ", what, " is not a tensor");
    TORCH_CHECK(t.layout() == at::kStrided, "spconv_c: ", what, " must be a strided (dense) tensor");
    TORCH_CHECK(t.dim() <= SPCONV_MAX_DIMS, "spconv_c: ", what, " has ", t.dim(), " dims, at most ",
                SPCONV_MAX_DIMS);
    spconv_dtype dtype = to_spconv_dtype(t.scalar_type(), what);
    spconv_device device = to_spconv_device(t.device(), what);
    auto *keep = new at::Tensor(t);
    spconv_tensor *out = nullptr;
    spconv_status s = spconv_tensor_wrap(device, dtype, static_cast<int>(t.dim()), t.sizes().data(),
                                         t.strides().data(), t.data_ptr(), drop_torch_reference,
                                         keep, &out);
    if (s != SPCONV_OK) {
        delete keep; // the deleter is not called on failure
        engine_failure(s, what);
    }
    return Handle(out);
}

Handle wrap_optional(const c10::optional<at::Tensor> &t, const char *what) {
    if (!t.has_value() || !t->defined()) return Handle();
    return wrap(*t, what);
}

// A CUDA output of the engine that holds the only reference to memory our hook took from the
// caching allocator (torch_cuda_alloc) becomes a torch tensor that owns that memory as the
// allocator's own block: its DataPtr carries the allocator's deleter, which is what
// Tensor.record_stream looks for (a from_blob tensor's record_stream does nothing). Undefined
// when the engine keeps a reference or the memory is not the hook's.
at::Tensor adopt_cuda_block(spconv_tensor *t, const std::vector<int64_t> &sizes,
                            const std::vector<int64_t> &strides, const at::TensorOptions &options) {
    c10::DeleterFnPtr deleter = c10::GetAllocator(c10::DeviceType::CUDA)->raw_deleter();
    if (deleter == nullptr) return at::Tensor();
    char *first = static_cast<char *>(spconv_tensor_data(t));
    const int64_t element = static_cast<int64_t>(spconv_dtype_size(spconv_tensor_dtype(t)));
    void *base = nullptr;
    size_t nbytes = 0;
    if (spconv_tensor_take_memory(t, torch_cuda_free, nullptr, &base, &nbytes) != SPCONV_OK)
        return at::Tensor(); /* t is as it was */
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                         c10::DataPtr(base, base, deleter, options.device()), nullptr, false);
    at::Tensor out = at::empty({0}, options);
    out.set_(storage, (first - static_cast<char *>(base)) / element, sizes, strides);
    return out;
}

// A torch tensor over the engine tensor's memory; takes over the reference in @p h.
at::Tensor to_torch(Handle &&h) {
    spconv_tensor *t = h.release();
    TORCH_CHECK(t != nullptr, "spconv_c: the engine returned no tensor");
    int ndim = spconv_tensor_ndim(t);
    std::vector<int64_t> sizes(spconv_tensor_sizes(t), spconv_tensor_sizes(t) + ndim);
    std::vector<int64_t> strides(spconv_tensor_strides(t), spconv_tensor_strides(t) + ndim);
    auto options = at::TensorOptions()
                       .dtype(to_torch_dtype(spconv_tensor_dtype(t)))
                       .device(to_torch_device(spconv_tensor_device(t)));
    if (spconv_tensor_device(t).type == SPCONV_DEVICE_CUDA) {
        at::Tensor adopted = adopt_cuda_block(t, sizes, strides, options);
        if (adopted.defined()) return adopted;
    }
    return torch::from_blob(spconv_tensor_data(t), sizes, strides,
                            [t](void *) { spconv_tensor_release(t); }, options);
}

// A torch view of a tensor the engine lends (borrowed from an object held by @p owner).
at::Tensor borrowed_to_torch(spconv_tensor *t) {
    spconv_tensor_retain(t);
    return to_torch(Handle(t));
}

void fill3(const std::vector<int64_t> &v, int64_t out[3], const char *what) {
    TORCH_CHECK(v.size() == 3 || v.size() == 1, "spconv_c: ", what, " needs 1 or 3 values, got ",
                v.size());
    for (int i = 0; i < 3; ++i) out[i] = v.size() == 1 ? v[0] : v[static_cast<size_t>(i)];
}

} // namespace

// ---- the rulebook handle ---------------------------------------------------------------------

struct Rulebook : torch::CustomClassHolder {
    spconv_rulebook *rb = nullptr;
    // The version of the indices tensor a build from indices read (-1: an inference tensor, which
    // has none; -2: not built from an indices tensor). A cache entry made inside a compiled graph,
    // where Python cannot read versions, takes it from here afterwards (core.IndiceEntry).
    int64_t sites_version = -2;
    explicit Rulebook(spconv_rulebook *r) : rb(r) {}
    ~Rulebook() override { spconv_rulebook_release(rb); }

    int64_t kind() const { return spconv_rulebook_params(rb)->kind; }
    int64_t num_in() const { return spconv_rulebook_num_in(rb); }
    int64_t num_out() const { return spconv_rulebook_num_out(rb); }
    int64_t num_pairs() const { return spconv_rulebook_num_pairs(rb); }
    int64_t kernel_volume() const { return spconv_rulebook_kernel_volume(rb); }
    int64_t batch_size() const { return spconv_rulebook_batch_size(rb); }
    std::vector<int64_t> kernel() const {
        const int64_t *k = spconv_rulebook_params(rb)->kernel;
        return {k[0], k[1], k[2]};
    }
    std::vector<int64_t> in_shape() const {
        int64_t s[3];
        spconv_rulebook_in_shape(rb, s);
        return {s[0], s[1], s[2]};
    }
    std::vector<int64_t> out_shape() const {
        int64_t s[3];
        spconv_rulebook_out_shape(rb, s);
        return {s[0], s[1], s[2]};
    }
    // int64 [KV + 1] prefix sums: the pairs of offset k are [offsets[k], offsets[k+1]).
    at::Tensor pair_offsets() const {
        int64_t kv = kernel_volume();
        at::Tensor out = at::empty({kv + 1}, at::kLong);
        int64_t *p = out.data_ptr<int64_t>();
        p[0] = 0;
        for (int64_t k = 0; k < kv; ++k) {
            int64_t begin = 0, end = 0;
            pair_range(rb, k, &begin, &end);
            // Pairs are stored offset after offset, so an empty offset ends where the last began.
            p[k + 1] = end > begin ? end : p[k];
        }
        return out;
    }
    // Copies: the executors rely on what the build recorded about the pair lists (their order,
    // the rows in range), so nothing outside the engine may write into them.
    at::Tensor pairs_in() const { return borrowed_to_torch(spconv_rulebook_pairs_in(rb)).clone(); }
    at::Tensor pairs_out() const {
        return borrowed_to_torch(spconv_rulebook_pairs_out(rb)).clone();
    }
    at::Tensor in_indices() const { return borrowed_to_torch(spconv_rulebook_in_indices(rb)); }
    at::Tensor out_indices() const { return borrowed_to_torch(spconv_rulebook_out_indices(rb)); }

    // What torch.compile's fake rulebook (python/spconv_c/ops.py, FakeRulebook) is rebuilt from.
    std::tuple<std::tuple<std::string, int64_t>, std::tuple<std::string, int64_t>,
               std::tuple<std::string, int64_t>, std::tuple<std::string, int64_t>>
    obj_flatten() const {
        return {{"kind", kind()}, {"num_in", num_in()}, {"num_out", num_out()},
                {"kernel_volume", kernel_volume()}};
    }
};

// ---- rulebook tokens ---------------------------------------------------------------------------

// A rulebook's token is a tensor that stands for the rulebook: uint8 [num_in, num_out, 0] on the
// rulebook's device, whose (empty) storage holds a reference to the rulebook. The *_token ops take
// it where the others take the handle. It exists for torch.compile's training graphs: AOTAutograd
// saves what a backward needs from the forward, and it saves tensors but refuses torchbind objects
// (PyTorch 2.15: "expected all opaque_object_outs to be opaque types"), so a conv or pool whose
// backward needs its rulebook could not be traced with the handle. A token is an ordinary graph
// input; views and detached aliases share its storage and so stand for the same rulebook, while a
// copy (a new storage) is refused by the ops with a message, never misread.
namespace {

struct TokenHold {
    c10::intrusive_ptr<Rulebook> rulebook;
};

void release_token(void *hold) { delete static_cast<TokenHold *>(hold); }

// The rulebook a token stands for (a new reference: the token may lose its storage to another
// thread's set_() while the op runs); anything else is an error naming @p op.
c10::intrusive_ptr<Rulebook> rulebook_of(const at::Tensor &token, const char *op) {
    TORCH_CHECK(token.defined() && token.has_storage() &&
                    token.storage().data_ptr().get_deleter() == &release_token,
                "spconv_c.", op, ": the rulebook argument is not a rulebook token (a tensor from "
                "Rulebook.token(), or a view of one); a copy of a token stands for nothing (under "
                "torch.compile, saved-tensor hooks that copy, such as "
                "torch.autograd.graph.save_on_cpu, and CUDA graphs' input copies make such copies)");
    const auto *hold = static_cast<const TokenHold *>(token.storage().data_ptr().get_context());
    const Rulebook &rb = *hold->rulebook;
    TORCH_CHECK(token.dim() == 3 && token.size(0) == rb.num_in() && token.size(1) == rb.num_out() &&
                    token.size(2) == 0,
                "spconv_c.", op, ": a rulebook token is [num_in, num_out, 0] = [", rb.num_in(), ", ",
                rb.num_out(), ", 0]; this one is ", token.sizes());
    return hold->rulebook;
}

// Rulebook.token(): a new token of @p rulebook.
at::Tensor rulebook_token(const c10::intrusive_ptr<Rulebook> &rulebook) {
    const Rulebook &rb = *rulebook;
    const at::Device device = to_torch_device(spconv_tensor_device(spconv_rulebook_pairs_in(rb.rb)));
    auto *hold = new TokenHold{rulebook};
    // Never an inference tensor, even when made under torch.inference_mode(): a token holds no
    // values to protect, and a compiled training graph that takes one saves it for its backward,
    // which AOTAutograd refuses for an inference tensor (and a clone of a token stands for
    // nothing, so its advice to clone could not be followed).
    c10::InferenceMode not_inference(false);
    // No bytes: the data pointer is never read; the context is what identifies a token.
    c10::DataPtr data(hold, hold, &release_token, device);
    c10::Storage storage(c10::Storage::use_byte_size_t(), 0, std::move(data), nullptr, false);
    at::Tensor token = at::empty({rb.num_in(), rb.num_out(), 0}, at::TensorOptions(at::kByte).device(device));
    token.set_(storage, 0, token.sizes(), token.strides());
    return token;
}

// The engine's parameters of a build op's kind and geometry (REGULAR, SUBM or TRANSPOSED).
spconv_conv_params conv_params(const char *op, int64_t kind, const std::vector<int64_t> &kernel,
                               const std::vector<int64_t> &stride,
                               const std::vector<int64_t> &padding,
                               const std::vector<int64_t> &dilation,
                               const std::vector<int64_t> &output_padding) {
    TORCH_CHECK(kind >= SPCONV_CONV_REGULAR && kind <= SPCONV_CONV_TRANSPOSED, "spconv_c.", op,
                ": kind ", kind,
                " is not 0 (regular/pool), 1 (subm) or 2 (transposed); inverse rulebooks come from "
                "inverse_rulebook");
    spconv_conv_params p = spconv_conv_params_default(static_cast<spconv_conv_kind>(kind));
    fill3(kernel, p.kernel, "kernel_size");
    fill3(stride, p.stride, "stride");
    fill3(padding, p.padding, "padding");
    fill3(dilation, p.dilation, "dilation");
    fill3(output_padding, p.output_padding, "output_padding");
    return p;
}

// Rulebook::sites_version of a build that reads @p indices.
int64_t version_of(const at::Tensor &indices) {
    return indices.is_inference() ? -1 : static_cast<int64_t>(indices._version());
}

// build_rulebook, with errors naming @p op (build_rulebook or build_subm_token).
c10::intrusive_ptr<Rulebook> build_named(const char *op, const at::Tensor &indices,
                                         const std::vector<int64_t> &spatial_shape,
                                         int64_t batch_size, int64_t kind,
                                         const std::vector<int64_t> &kernel,
                                         const std::vector<int64_t> &stride,
                                         const std::vector<int64_t> &padding,
                                         const std::vector<int64_t> &dilation,
                                         const std::vector<int64_t> &output_padding) {
    TORCH_CHECK(indices.device().is_cpu() || indices.device().is_cuda(), "spconv_c.", op,
                ": indices are on ", indices.device(),
                "; the engine builds rulebooks on the CPU or on a CUDA device");
    const spconv_conv_params p = conv_params(op, kind, kernel, stride, padding, dilation,
                                             output_padding);
    int64_t shape[3];
    fill3(spatial_shape, shape, "spatial_shape");
    Handle idx = wrap(indices, "indices");
    DeviceScope scope(indices.device());
    spconv_rulebook *rb = nullptr;
    SPCONV_TRY(op, spconv_rulebook_build(scope.ctx, idx.t, shape, batch_size, &p, &rb));
    scope.finish();
    auto built = c10::make_intrusive<Rulebook>(rb);
    built->sites_version = version_of(indices);
    return built;
}

c10::intrusive_ptr<Rulebook> build_rulebook(const at::Tensor &indices,
                                            std::vector<int64_t> spatial_shape, int64_t batch_size,
                                            int64_t kind, std::vector<int64_t> kernel,
                                            std::vector<int64_t> stride, std::vector<int64_t> padding,
                                            std::vector<int64_t> dilation,
                                            std::vector<int64_t> output_padding) {
    return build_named("build_rulebook", indices, spatial_shape, batch_size, kind, kernel, stride,
                       padding, dilation, output_padding);
}

// build_rulebook over one side of @p source (spconv_rulebook_build_on): the caller (the modules'
// rulebook_for) has checked that the indices it holds for that side are unchanged since.
// The new rulebook with its output sites (a view, as Rulebook.out_indices() gives) and output
// spatial shape: the modules need both, and asking the handle for them afterwards cost two more
// calls from Python into a torchbind object, ~0.1 ms each when a conv before them has left the
// caches cold (docs/pytorch.md, "The overhead on an AVX-512 Xeon").
std::tuple<c10::intrusive_ptr<Rulebook>, at::Tensor, std::vector<int64_t>>
build_rulebook_on(const c10::intrusive_ptr<Rulebook> &source, bool output_side, int64_t kind,
                  std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, std::vector<int64_t> dilation,
                  std::vector<int64_t> output_padding) {
    const spconv_conv_params p = conv_params("build_rulebook_on", kind, kernel, stride, padding,
                                             dilation, output_padding);
    spconv_tensor *sites = output_side ? spconv_rulebook_out_indices(source->rb)
                                       : spconv_rulebook_in_indices(source->rb);
    DeviceScope scope(to_torch_device(spconv_tensor_device(sites)));
    spconv_rulebook *rb = nullptr;
    SPCONV_TRY("build_rulebook_on",
               spconv_rulebook_build_on(scope.ctx, source->rb, output_side ? 1 : 0, &p, &rb));
    scope.finish();
    auto built = c10::make_intrusive<Rulebook>(rb);
    return {built, built->out_indices(), built->out_shape()};
}

c10::intrusive_ptr<Rulebook> inverse_rulebook(const c10::intrusive_ptr<Rulebook> &forward) {
    spconv_rulebook *rb = nullptr;
    SPCONV_TRY("inverse_rulebook", spconv_rulebook_inverse(forward->rb, &rb));
    return c10::make_intrusive<Rulebook>(rb);
}

// The conv and pool ops on a rulebook, named @p op in their errors; each is registered twice,
// with the rulebook's handle (conv_forward, ...) and with its token (conv_forward_token, ...).
at::Tensor conv_forward_on(const Rulebook &rb, const at::Tensor &features, const at::Tensor &weight,
                           const c10::optional<at::Tensor> &bias, const char *op) {
    Handle f = wrap(features, "features"), w = wrap(weight, "weight");
    Handle b = wrap_optional(bias, "bias");
    DeviceScope scope(features.device());
    spconv_tensor *out = nullptr;
    SPCONV_TRY(op, spconv_conv_forward(scope.ctx, rb.rb, f.t, w.t, b.t, &out));
    Handle result(out);
    scope.finish();
    return to_torch(std::move(result));
}

// An inference batch norm (and ReLU) folded into the conv (spconv_conv_forward_affine): each
// output y becomes fma(y, scale, shift) with PyTorch's own scale and shift for batch norm in eval
// mode, computed as its CPU kernel computes them (batch_norm_cpu_collect_linear_and_constant_terms:
// invstd = 1 / sqrt(var + eps) in the parameters' type, scale = invstd * weight, shift = bias -
// mean * scale as one fused multiply-add), so that the result is bitwise PyTorch's conv ->
// BatchNorm1d -> ReLU wherever PyTorch's build computes output = fma(x, scale, shift) too. The
// modules check that once per process against torch.batch_norm itself before they use this op
// (python/spconv_c/pytorch/modules.py). CPU, f32 / f64, batch-norm tensors in the features' dtype.
template <typename T>
void batchnorm_terms(const at::Tensor &weight, const at::Tensor &bias, const at::Tensor &mean,
                     const at::Tensor &var, double eps, T *scale, T *shift, int64_t c) {
    const T *w = weight.defined() ? weight.data_ptr<T>() : nullptr;
    const T *b = bias.defined() ? bias.data_ptr<T>() : nullptr;
    const T *m = mean.data_ptr<T>(), *v = var.data_ptr<T>();
    for (int64_t j = 0; j < c; ++j) {
        const T invstd = T(1) / std::sqrt(v[j] + static_cast<T>(eps));
        scale[j] = invstd * (w != nullptr ? w[j] : T(1));
        shift[j] = std::fma(-m[j], scale[j], b != nullptr ? b[j] : T(0));
    }
}

// The modules' KRSC weight, [C_out, *K, C_in] with 1 to 3 kernel axes, as the engine's
// [KD, KH, KW, C_in, C_out], views only (in Python that permute was a dispatcher call per conv,
// ~0.05 ms each after a conv has left the caches cold).
at::Tensor engine_weight(const at::Tensor &krsc, const char *op) {
    TORCH_CHECK(krsc.dim() >= 3 && krsc.dim() <= 5, "spconv_c.", op, ": a KRSC weight is [C_out, "
                "*K, C_in] with 1 to 3 kernel axes, got ", krsc.sizes());
    std::vector<int64_t> order;
    for (int64_t d = 1; d < krsc.dim(); ++d) order.push_back(d);
    order.push_back(0);
    at::Tensor w = krsc.permute(order);
    while (w.dim() < 5) w = w.unsqueeze(0);
    return w;
}

at::Tensor conv_forward_bn(const c10::intrusive_ptr<Rulebook> &rb, const at::Tensor &features,
                           const at::Tensor &weight_arg, const c10::optional<at::Tensor> &bias,
                           const c10::optional<at::Tensor> &bn_weight,
                           const c10::optional<at::Tensor> &bn_bias, const at::Tensor &running_mean,
                           const at::Tensor &running_var, double eps, bool relu, bool krsc) {
    const at::ScalarType dtype = features.scalar_type();
    const at::Tensor weight = krsc ? engine_weight(weight_arg, "conv_forward_bn") : weight_arg;
    TORCH_CHECK(features.device().is_cpu(), "spconv_c.conv_forward_bn: features are on ",
                features.device(), "; the folded batch norm runs on the CPU");
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
                "spconv_c.conv_forward_bn: float32 / float64 features only, not ", dtype);
    const int64_t c = weight.dim() > 0 ? weight.size(-1) : 0; // the engine checks the rest
    auto vector = [&](const at::Tensor &t, const char *name) {
        TORCH_CHECK(t.dim() == 1 && t.size(0) == c && t.scalar_type() == dtype && t.device().is_cpu(),
                    "spconv_c.conv_forward_bn: ", name, " must be a CPU ", dtype, " [", c,
                    "] (C_out), got ", t.scalar_type(), " ", t.sizes(), " on ", t.device());
        return t.contiguous();
    };
    at::Tensor w = bn_weight.has_value() && bn_weight->defined() ? vector(*bn_weight, "bn_weight") : at::Tensor();
    at::Tensor b = bn_bias.has_value() && bn_bias->defined() ? vector(*bn_bias, "bn_bias") : at::Tensor();
    at::Tensor mean = vector(running_mean, "running_mean"), var = vector(running_var, "running_var");
    at::Tensor scale = at::empty({c}, features.options()), shift = at::empty({c}, features.options());
    if (dtype == at::kFloat)
        batchnorm_terms<float>(w, b, mean, var, eps, scale.data_ptr<float>(), shift.data_ptr<float>(), c);
    else
        batchnorm_terms<double>(w, b, mean, var, eps, scale.data_ptr<double>(), shift.data_ptr<double>(), c);
    Handle f = wrap(features, "features"), wt = wrap(weight, "weight");
    Handle bb = wrap_optional(bias, "bias");
    Handle sc = wrap(scale, "scale"), sh = wrap(shift, "shift");
    spconv_context *ctx = context_for(features.device());
    spconv_tensor *out = nullptr;
    SPCONV_TRY("conv_forward_bn", spconv_conv_forward_affine(ctx, rb->rb, f.t, wt.t, bb.t, sc.t, sh.t,
                                                             relu ? 1 : 0, &out));
    return to_torch(Handle(out));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
conv_backward_on(const Rulebook &rb, const at::Tensor &features, const at::Tensor &weight,
                 const at::Tensor &grad_out, const c10::List<bool> &output_mask, const char *op) {
    TORCH_CHECK(output_mask.size() == 3, "spconv_c.", op, ": output_mask needs 3 values");
    Handle f = wrap(features, "features"), w = wrap(weight, "weight"), g = wrap(grad_out, "grad_out");
    DeviceScope scope(features.device());
    spconv_tensor *gf = nullptr, *gw = nullptr, *gb = nullptr;
    SPCONV_TRY(op,
               spconv_conv_backward(scope.ctx, rb.rb, f.t, w.t, g.t, output_mask.get(0) ? &gf : nullptr,
                                    output_mask.get(1) ? &gw : nullptr, output_mask.get(2) ? &gb : nullptr));
    Handle hf(gf), hw(gw), hb(gb);
    scope.finish();
    // Gradients not asked for are empty tensors (the schema's outputs are not optional).
    auto empty = [&](const at::Tensor &like) { return at::empty({0}, like.options()); };
    return {gf ? to_torch(std::move(hf)) : empty(features), gw ? to_torch(std::move(hw)) : empty(weight),
            gb ? to_torch(std::move(hb)) : empty(weight)};
}

std::tuple<at::Tensor, at::Tensor> maxpool_forward_on(const Rulebook &rb, const at::Tensor &features,
                                                      const char *op) {
    Handle f = wrap(features, "features");
    DeviceScope scope(features.device());
    spconv_tensor *out = nullptr, *argmax = nullptr;
    SPCONV_TRY(op, spconv_maxpool_forward(scope.ctx, rb.rb, f.t, &out, &argmax));
    Handle ho(out), ha(argmax);
    scope.finish();
    return {to_torch(std::move(ho)), to_torch(std::move(ha))};
}

// The max pool without its argmax, for inference: the argmax is an int32 [N_out, C] as large as
// the output, written only for a backward (basic's first pool: 17 MB a pass, 1.8 ms of its 5).
at::Tensor maxpool_inference(const c10::intrusive_ptr<Rulebook> &rb, const at::Tensor &features) {
    Handle f = wrap(features, "features");
    DeviceScope scope(features.device());
    spconv_tensor *out = nullptr;
    SPCONV_TRY("maxpool_inference", spconv_maxpool_forward(scope.ctx, rb->rb, f.t, &out, nullptr));
    Handle ho(out);
    scope.finish();
    return to_torch(std::move(ho));
}

at::Tensor maxpool_backward_on(const Rulebook &rb, const at::Tensor &argmax, const at::Tensor &grad_out,
                               const char *op) {
    Handle a = wrap(argmax, "argmax"), g = wrap(grad_out, "grad_out");
    DeviceScope scope(grad_out.device());
    spconv_tensor *out = nullptr;
    SPCONV_TRY(op, spconv_maxpool_backward(scope.ctx, rb.rb, a.t, g.t, &out));
    Handle ho(out);
    scope.finish();
    return to_torch(std::move(ho));
}

at::Tensor conv_forward(const c10::intrusive_ptr<Rulebook> &rb, const at::Tensor &features,
                        const at::Tensor &weight, const c10::optional<at::Tensor> &bias) {
    return conv_forward_on(*rb, features, weight, bias, "conv_forward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
conv_backward(const c10::intrusive_ptr<Rulebook> &rb, const at::Tensor &features,
              const at::Tensor &weight, const at::Tensor &grad_out, const c10::List<bool> &output_mask) {
    return conv_backward_on(*rb, features, weight, grad_out, output_mask, "conv_backward");
}

std::tuple<at::Tensor, at::Tensor> maxpool_forward(const c10::intrusive_ptr<Rulebook> &rb,
                                                   const at::Tensor &features) {
    return maxpool_forward_on(*rb, features, "maxpool_forward");
}

at::Tensor maxpool_backward(const c10::intrusive_ptr<Rulebook> &rb, const at::Tensor &argmax,
                            const at::Tensor &grad_out) {
    return maxpool_backward_on(*rb, argmax, grad_out, "maxpool_backward");
}

// With the token (rulebook_token above): the rulebook it holds is kept for the call.
at::Tensor conv_forward_token(const at::Tensor &token, const at::Tensor &features,
                              const at::Tensor &weight, const c10::optional<at::Tensor> &bias) {
    const char *op = "conv_forward_token";
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(token, op);
    return conv_forward_on(*rb, features, weight, bias, op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
conv_backward_token(const at::Tensor &token, const at::Tensor &features, const at::Tensor &weight,
                    const at::Tensor &grad_out, const c10::List<bool> &output_mask) {
    const char *op = "conv_backward_token";
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(token, op);
    return conv_backward_on(*rb, features, weight, grad_out, output_mask, op);
}

std::tuple<at::Tensor, at::Tensor> maxpool_forward_token(const at::Tensor &token,
                                                         const at::Tensor &features) {
    const char *op = "maxpool_forward_token";
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(token, op);
    return maxpool_forward_on(*rb, features, op);
}

at::Tensor maxpool_backward_token(const at::Tensor &token, const at::Tensor &argmax,
                                  const at::Tensor &grad_out) {
    const char *op = "maxpool_backward_token";
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(token, op);
    return maxpool_backward_on(*rb, argmax, grad_out, op);
}

// ---- average pool: ATen over the rulebook's pairs -----------------------------------------------

// spconv's SparseAvgPool: each output is the mean over the active inputs of its window (its pairs),
// not over the window's volume. The engine has no average pool; these run PyTorch's own index ops
// over the rulebook's pair lists, so they serve either device. Sums go offset after offset in
// increasing k, each offset one index_add_ without repeated rows (a window has one input per
// offset, an input one output per offset), so they are the same bits on every device and run;
// 16-bit values are summed in float32 and rounded once. Backward is the adjoint: each input gets
// grad_out / count of every window it is in.
namespace {

struct PoolPairs {
    at::Tensor in, out, count;    // int64 pair rows on the values' device, float counts per output
    const int64_t *starts = nullptr; // [active + 1]: the pairs of the j-th offset that has any
    int64_t active = 0;              // (spconv_rulebook_active_starts; increasing offsets)
};

at::ScalarType sum_type(at::ScalarType t) {
    return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// @p values must be floating [rows, C] (the row count its side of the rulebook has).
void check_pool_values(const at::Tensor &values, int64_t rows, const char *what, const char *op) {
    const bool floating = values.defined() && (values.scalar_type() == at::kHalf ||
                                               values.scalar_type() == at::kBFloat16 ||
                                               values.scalar_type() == at::kFloat ||
                                               values.scalar_type() == at::kDouble);
    TORCH_CHECK(floating, "spconv_c.", op, ": ",
                what, " must be floating (float16, bfloat16, float32, float64), got ",
                values.defined() ? c10::toString(values.scalar_type()) : "no tensor");
    TORCH_CHECK(values.dim() == 2 && values.size(0) == rows, "spconv_c.", op, ": ", what,
                " must be [", rows, ", C] (a row per site), got ", values.sizes());
}

PoolPairs pool_pairs(const Rulebook &rb, const at::Tensor &values) {
    PoolPairs p;
    // Only the offsets that have pairs: a window as large as the grid (a global pool) has tens of
    // millions of offsets, and walking them all (pair_offsets) took seconds and gigabytes.
    p.active = spconv_rulebook_num_active_offsets(rb.rb);
    p.starts = spconv_rulebook_active_starts(rb.rb);
    // The rulebook may live on another device than the values (a host rulebook serves CUDA ones).
    auto rows = [&](spconv_tensor *t) { return borrowed_to_torch(t).to(values.device(), at::kLong); };
    p.in = rows(spconv_rulebook_pairs_in(rb.rb));
    p.out = rows(spconv_rulebook_pairs_out(rb.rb));
    // Every output of a regular or transposed rulebook has a pair; an inverse one's outputs
    // outside every window have none, and get 0 (a count of 1 over a sum of nothing).
    p.count = at::bincount(p.out, {}, rb.num_out()).clamp_min_(1).to(sum_type(values.scalar_type()));
    p.count = p.count.unsqueeze(1);
    return p;
}

// dst[to[b:e]] += src[from[b:e]] for each offset's pair range [b, e), in increasing offset.
void add_by_offset(at::Tensor &dst, const at::Tensor &src, const at::Tensor &from, const at::Tensor &to,
                   const PoolPairs &p) {
    for (int64_t j = 0; j < p.active; ++j) {
        const int64_t b = p.starts[j], e = p.starts[j + 1];
        if (e > b) dst.index_add_(0, to.slice(0, b, e), src.index_select(0, from.slice(0, b, e)));
    }
}

at::Tensor avgpool_forward_on(const Rulebook &rb, const at::Tensor &features, const char *op) {
    check_pool_values(features, rb.num_in(), "features", op);
    const at::ScalarType acc = sum_type(features.scalar_type());
    at::Tensor total = at::zeros({rb.num_out(), features.size(1)}, features.options().dtype(acc));
    if (rb.num_pairs() == 0) return total.to(features.scalar_type());
    const PoolPairs p = pool_pairs(rb, features);
    add_by_offset(total, features.to(acc), p.in, p.out, p);
    return total.div_(p.count).to(features.scalar_type());
}

at::Tensor avgpool_backward_on(const Rulebook &rb, const at::Tensor &grad_out, const char *op) {
    check_pool_values(grad_out, rb.num_out(), "grad_out", op);
    const at::ScalarType acc = sum_type(grad_out.scalar_type());
    at::Tensor grad = at::zeros({rb.num_in(), grad_out.size(1)}, grad_out.options().dtype(acc));
    if (rb.num_pairs() == 0) return grad.to(grad_out.scalar_type());
    const PoolPairs p = pool_pairs(rb, grad_out);
    add_by_offset(grad, grad_out.to(acc) / p.count, p.out, p.in, p);
    return grad.to(grad_out.scalar_type());
}

} // namespace

at::Tensor avgpool_forward(const c10::intrusive_ptr<Rulebook> &rb, const at::Tensor &features) {
    return avgpool_forward_on(*rb, features, "avgpool_forward");
}

at::Tensor avgpool_backward(const c10::intrusive_ptr<Rulebook> &rb, const at::Tensor &grad_out) {
    return avgpool_backward_on(*rb, grad_out, "avgpool_backward");
}

at::Tensor avgpool_forward_token(const at::Tensor &token, const at::Tensor &features) {
    const char *op = "avgpool_forward_token";
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(token, op);
    return avgpool_forward_on(*rb, features, op);
}

at::Tensor avgpool_backward_token(const at::Tensor &token, const at::Tensor &grad_out) {
    const char *op = "avgpool_backward_token";
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(token, op);
    return avgpool_backward_on(*rb, grad_out, op);
}

// ---- builders that return tokens, traced inside compiled graphs -------------------------------

// The token builders give the rulebook its own copy of the indices (16 bytes a site) and hand
// back copies of its output sites, where build_rulebook shares them: inside a compiled graph,
// inductor takes a tensor no later node reads as dead and reuses its memory for another, and
// nothing in an op's schema says that the rulebook keeps reading those rows (build_rulebook_on
// trusts them, pickling rebuilds from them).
at::Tensor own_copy(const at::Tensor &indices) {
    return indices.clone(at::MemoryFormat::Contiguous);
}

// A submanifold rulebook, as its token: build_rulebook with kind SUBM on the same arguments (the
// same rulebook). Its output sites are its input sites, so its token is [N, N, 0] for N index rows
// before anything runs: torch.compile traces this build inside the graph (fake kernel in ops.py),
// where a build whose output count depends on the data is a graph break.
at::Tensor build_subm_token(const at::Tensor &indices, std::vector<int64_t> spatial_shape,
                            int64_t batch_size, std::vector<int64_t> kernel,
                            std::vector<int64_t> stride, std::vector<int64_t> padding,
                            std::vector<int64_t> dilation, std::vector<int64_t> output_padding) {
    const c10::intrusive_ptr<Rulebook> rb =
        build_named("build_subm_token", own_copy(indices), spatial_shape, batch_size,
                    SPCONV_CONV_SUBM, kernel, stride, padding, dilation, output_padding);
    rb->sites_version = version_of(indices);
    return rulebook_token(rb);
}

// A regular, pool or transposed rulebook, as its token, and a copy of its output sites (int32
// [M, 4], what Rulebook.out_indices() views). M depends on the data: the fake kernel
// (ops.py) makes it an unbacked size, so torch.compile traces this build inside the graph too.
std::tuple<at::Tensor, at::Tensor>
build_rulebook_token(const at::Tensor &indices, std::vector<int64_t> spatial_shape,
                     int64_t batch_size, int64_t kind, std::vector<int64_t> kernel,
                     std::vector<int64_t> stride, std::vector<int64_t> padding,
                     std::vector<int64_t> dilation, std::vector<int64_t> output_padding) {
    const char *op = "build_rulebook_token";
    TORCH_CHECK(kind != SPCONV_CONV_SUBM, "spconv_c.", op,
                ": kind 1 (subm) is build_subm_token's (its output sites are its input's)");
    const c10::intrusive_ptr<Rulebook> rb = build_named(op, own_copy(indices), spatial_shape,
                                                        batch_size, kind, kernel, stride, padding,
                                                        dilation, output_padding);
    rb->sites_version = version_of(indices);
    return {rulebook_token(rb), rb->out_indices().clone()};
}

// inverse_rulebook over tokens: the inverse of a [num_in, num_out] rulebook is [num_out, num_in].
at::Tensor inverse_token(const at::Tensor &forward) {
    const char *op = "inverse_token";
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(forward, op);
    spconv_rulebook *inv = nullptr;
    SPCONV_TRY(op, spconv_rulebook_inverse(rb->rb, &inv));
    return rulebook_token(c10::make_intrusive<Rulebook>(inv));
}

// A new token of @p token's rulebook, after checking that @p indices, the sites it is about to be
// used on, have not been written into since the rulebook was built: their version is @p version
// (-1: the one the build read, Rulebook.sites_version; -2 or an inference tensor: nothing to
// compare), else a ValueError saying @p what. Compiled code cannot read a tensor's version, so
// the indice_key cache's check that a cached rulebook's sites are unchanged happens here, when the
// graph runs; the new token is what the conv takes, so that the check is never dropped as dead.
at::Tensor check_sites_token(const at::Tensor &token, const at::Tensor &indices, int64_t version,
                             c10::string_view what) {
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(token, "check_sites_token");
    const int64_t expected = version == -1 ? rb->sites_version : version;
    TORCH_CHECK_VALUE(expected < 0 || indices.is_inference() || indices._version() == expected,
                      what);
    return rulebook_token(rb);
}

// A new token of @p token's rulebook, after checking that @p rows, the engine's int32 [N, 4] sites
// that a 1-d / 2-d layer's cached rulebook is about to be used on, still lift @p indices, the
// layer's own int32 [N, 1 + ndim] sites: (b, 0, ..., coordinates), row for row; else a ValueError
// saying @p what. Eager code lifts the rows again once the nd indices are written into (their
// version moves); compiled code cannot read versions and keeps the rows it was given, so this
// compares their values where the graph runs. The new token is what the conv takes, as with
// check_sites_token.
at::Tensor check_lifted_token(const at::Tensor &token, const at::Tensor &rows,
                              const at::Tensor &indices, c10::string_view what) {
    const c10::intrusive_ptr<Rulebook> rb = rulebook_of(token, "check_lifted_token");
    TORCH_CHECK(rows.dim() == 2 && rows.size(1) == 4 && indices.dim() == 2 &&
                    indices.size(1) >= 2 && indices.size(1) <= 3 &&
                    rows.scalar_type() == indices.scalar_type() &&
                    rows.device() == indices.device(),
                "spconv_c.check_lifted_token: rows must be [N, 4] and indices [N, 2] or [N, 3], "
                "of one dtype and device; got ", rows.sizes(), " ", rows.scalar_type(), " on ",
                rows.device(), " and ", indices.sizes(), " ", indices.scalar_type(), " on ",
                indices.device());
    const int64_t nd = indices.size(1) - 1, n = rows.size(0);
    bool same = n == indices.size(0);
    if (same && rows.is_cpu() && rows.scalar_type() == at::kInt && rows.is_contiguous() &&
        indices.is_contiguous()) {
        // One pass over both (a few times faster than the slices' compares below).
        const int32_t *r = rows.data_ptr<int32_t>(), *x = indices.data_ptr<int32_t>();
        int32_t differ = 0;
        if (nd == 2)
            for (int64_t i = 0; i < n; ++i)
                differ |= (r[4 * i] ^ x[3 * i]) | r[4 * i + 1] | (r[4 * i + 2] ^ x[3 * i + 1]) |
                          (r[4 * i + 3] ^ x[3 * i + 2]);
        else
            for (int64_t i = 0; i < n; ++i)
                differ |= (r[4 * i] ^ x[2 * i]) | r[4 * i + 1] | r[4 * i + 2] |
                          (r[4 * i + 3] ^ x[2 * i + 1]);
        same = differ == 0;
    } else if (same) {
        same = rows.select(1, 0).equal(indices.select(1, 0)) &&
               rows.narrow(1, 4 - nd, nd).equal(indices.narrow(1, 1, nd)) &&
               rows.narrow(1, 1, 3 - nd).count_nonzero().item<int64_t>() == 0;
    }
    TORCH_CHECK_VALUE(same, what);
    return rulebook_token(rb);
}

// The handle a token stands for (eager code that holds a token made inside a compiled graph).
c10::intrusive_ptr<Rulebook> token_rulebook(const at::Tensor &token) {
    return rulebook_of(token, "token_rulebook");
}

at::Tensor sparse_to_dense(const at::Tensor &features, const at::Tensor &indices,
                           std::vector<int64_t> spatial_shape, int64_t batch_size) {
    int64_t shape[3];
    fill3(spatial_shape, shape, "spatial_shape");
    Handle f = wrap(features, "features"), i = wrap(indices, "indices");
    DeviceScope scope(features.device());
    spconv_tensor *out = nullptr;
    SPCONV_TRY("sparse_to_dense", spconv_sparse_to_dense(scope.ctx, f.t, i.t, shape, batch_size, &out));
    Handle ho(out);
    scope.finish();
    return to_torch(std::move(ho));
}

// voxels [M, max_points, F], features (mean) [M, F], coords [M, 3] (z, y, x), num_points [M],
// point_voxel [P], grid_size [3] (x, y, z).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
voxelize(const at::Tensor &points, std::vector<double> voxel_size, std::vector<double> range,
         int64_t max_points, int64_t max_voxels) {
    TORCH_CHECK(voxel_size.size() == 3, "spconv_c.voxelize: voxel_size needs 3 values (x, y, z)");
    TORCH_CHECK(range.size() == 6, "spconv_c.voxelize: coors_range needs 6 values (min xyz, max xyz)");
    TORCH_CHECK(points.device().is_cpu(), "spconv_c.voxelize: points are on ", points.device(),
                "; the engine voxelizes CPU points");
    spconv_voxelize_params p;
    std::memset(&p, 0, sizeof p);
    for (int i = 0; i < 3; ++i) p.voxel_size[i] = static_cast<float>(voxel_size[static_cast<size_t>(i)]);
    for (int i = 0; i < 6; ++i) p.range[i] = static_cast<float>(range[static_cast<size_t>(i)]);
    p.max_points = max_points;
    p.max_voxels = max_voxels;
    p.outputs = SPCONV_VOXELIZE_VOXELS | SPCONV_VOXELIZE_MEAN;
    Handle pts = wrap(points, "points");
    spconv_voxels v;
    std::memset(&v, 0, sizeof v);
    SPCONV_TRY("voxelize", spconv_voxelize(context_for(points.device()), pts.t, &p, &v));
    at::Tensor grid = at::tensor({v.grid_size[0], v.grid_size[1], v.grid_size[2]}, at::kLong);
    // Each output's reference moves into its torch tensor; the struct is then empty.
    Handle vox(v.voxels), mean(v.features), coords(v.coords), num(v.num_points), pv(v.point_voxel);
    return {to_torch(std::move(vox)), to_torch(std::move(mean)), to_torch(std::move(coords)),
            to_torch(std::move(num)), to_torch(std::move(pv)), grid};
}

// ---- an inference sequence in one call ---------------------------------------------------------

// What SparseSequential hands over to run a whole inference sequence of convs (each with its
// folded batch norm and ReLU, where it has them) and max pools, in the engine's 3-d space (a 1-d
// or 2-d sequence's sites and geometry lifted, as its layers lift them), in one call from Python
// (python/spconv_c/pytorch/sequence.py): the same functions the per-layer ops call,
// in the same order, so the results and rulebooks are the ones the layers give one by one. What
// it saves is the modules' Python and one call from Python into C++ per layer, each paid cold
// after a conv has streamed its operands through the caches (docs/pytorch.md, "A sequence in
// one call"). Not an operator: it is eager inference only, which nothing traces, records or
// compiles (the modules check that before they use it), and it has no meaning under fake tensors.
struct SequenceRunner : torch::CustomClassHolder {};

// Each step is kStepInts integers:
//   [0] what: kStepConv, kStepMaxPool or kStepToDense
//   [1] the rulebook's kind (REGULAR, SUBM or TRANSPOSED; a pool's is REGULAR)
//   [2] where the rulebook comes from (kSource*), [3] the rulebook that names (ref, below)
//   [4..18] kernel, stride, padding, dilation, output_padding (3 values each)
//   [19] ReLU after the folded batch norm, [20] a folded batch norm
// and six tensors: the conv's KRSC weight and bias, the batch norm's weight, bias, running mean
// and running variance (None where there is none), and one eps. A ref >= 0 is the rulebook of
// that earlier step of this call, a ref < 0 is known[-1 - ref] (one of the indice_key cache's).
constexpr size_t kStepInts = 21;
constexpr int64_t kStepConv = 0, kStepMaxPool = 1;
constexpr int64_t kStepToDense = 2; // the last step only: the dense [B, C, D, H, W] (no rulebook)
constexpr int64_t kSourceIndices = 0;  // build from @p indices (the input's sites), checking them
constexpr int64_t kSourceOutputs = 1;  // build on the ref's output sites (build_rulebook_on)
constexpr int64_t kSourceInputs = 2;   // build on the ref's input sites
constexpr int64_t kSourceReuse = 3;    // the ref itself (a subm rulebook of the same key)

// Returns the last step's features (a to-dense step's dense map), each step's rulebook (but a
// to-dense step's), the output sites of each step that changes them (not subm), in order, and
// their spatial shapes (3 values each).
std::tuple<at::Tensor, std::vector<c10::intrusive_ptr<Rulebook>>, std::vector<at::Tensor>,
           std::vector<int64_t>>
run_sequence(const c10::intrusive_ptr<SequenceRunner> & /*self*/, at::Tensor features,
             const at::Tensor &indices, std::vector<int64_t> spatial_shape, int64_t batch_size,
             std::vector<c10::intrusive_ptr<Rulebook>> known, std::vector<int64_t> steps,
             c10::List<c10::optional<at::Tensor>> tensors, std::vector<double> eps) {
    const char *op = "run_sequence";
    // A profiler sees the call and, inside it, each step as the op its layer would call.
    RECORD_FUNCTION("spconv_c::run_sequence", std::vector<c10::IValue>());
    const size_t count = steps.size() / kStepInts;
    TORCH_CHECK(steps.size() == count * kStepInts && tensors.size() == 6 * count &&
                    eps.size() == count,
                "spconv_c.", op, ": ", steps.size(), " step integers, ", tensors.size(),
                " tensors and ", eps.size(), " eps values do not make whole steps of ", kStepInts,
                ", 6 and 1");
    std::vector<c10::intrusive_ptr<Rulebook>> made;
    made.reserve(count);
    std::vector<at::Tensor> sites;
    std::vector<int64_t> shapes;
    for (size_t i = 0; i < count; ++i) {
        const int64_t *s = steps.data() + i * kStepInts;
        const int64_t what = s[0], kind = s[1], source = s[2], ref = s[3];
        if (what == kStepToDense) {
            TORCH_CHECK(i + 1 == count, "spconv_c.", op, ": step ", i,
                        " (to dense) is not the last");
            const std::vector<int64_t> shape =
                shapes.empty() ? spatial_shape
                               : std::vector<int64_t>(shapes.end() - 3, shapes.end());
            RECORD_FUNCTION("spconv_c::sparse_to_dense", std::vector<c10::IValue>());
            features = sparse_to_dense(features, sites.empty() ? indices : sites.back(), shape,
                                       batch_size);
            break;
        }
        auto three = [&](size_t at) { return std::vector<int64_t>(s + at, s + at + 3); };
        auto tensor = [&](size_t slot) { return tensors.get(6 * i + slot); };
        c10::intrusive_ptr<Rulebook> from;
        if (source != kSourceIndices) {
            const bool earlier = ref >= 0 && static_cast<size_t>(ref) < made.size();
            const bool given = ref < 0 && static_cast<size_t>(-1 - ref) < known.size();
            TORCH_CHECK(earlier || given, "spconv_c.", op, ": step ", i, " names rulebook ", ref,
                        ", which is neither an earlier step's nor a given one");
            from = earlier ? made[static_cast<size_t>(ref)] : known[static_cast<size_t>(-1 - ref)];
        }
        c10::intrusive_ptr<Rulebook> rb;
        if (source == kSourceIndices) {
            RECORD_FUNCTION("spconv_c::build_rulebook", std::vector<c10::IValue>());
            rb = build_named("build_rulebook", indices, spatial_shape, batch_size, kind, three(4),
                             three(7), three(10), three(13), three(16));
        } else if (source == kSourceOutputs || source == kSourceInputs) {
            RECORD_FUNCTION("spconv_c::build_rulebook_on", std::vector<c10::IValue>());
            rb = std::get<0>(build_rulebook_on(from, source == kSourceOutputs, kind, three(4),
                                               three(7), three(10), three(13), three(16)));
        } else {
            TORCH_CHECK(source == kSourceReuse && kind == SPCONV_CONV_SUBM &&
                            from->kind() == SPCONV_CONV_SUBM,
                        "spconv_c.", op, ": step ", i, ": source ", source, " (kind ", kind,
                        ") is not one of 0 to 3, or reuses a rulebook that is not subm");
            rb = from;
        }
        if (kind != SPCONV_CONV_SUBM) {
            sites.push_back(rb->out_indices());
            for (int64_t v : rb->out_shape()) shapes.push_back(v);
        }
        if (what == kStepConv) {
            const c10::optional<at::Tensor> weight = tensor(0);
            TORCH_CHECK(weight.has_value() && weight->defined(), "spconv_c.", op, ": step ", i,
                        " is a conv without a weight");
            if (s[20] != 0) {
                const c10::optional<at::Tensor> mean = tensor(4), var = tensor(5);
                TORCH_CHECK(mean.has_value() && var.has_value(), "spconv_c.", op, ": step ", i,
                            " folds a batch norm without running statistics");
                RECORD_FUNCTION("spconv_c::conv_forward_bn", std::vector<c10::IValue>());
                features = conv_forward_bn(rb, features, *weight, tensor(1), tensor(2), tensor(3),
                                           *mean, *var, eps[i], s[19] != 0, /*krsc=*/true);
            } else {
                RECORD_FUNCTION("spconv_c::conv_forward", std::vector<c10::IValue>());
                features = conv_forward_on(*rb, features, engine_weight(*weight, "conv_forward"),
                                           tensor(1), "conv_forward");
            }
        } else {
            TORCH_CHECK(what == kStepMaxPool, "spconv_c.", op, ": step ", i, " is ", what,
                        ", neither a conv (0), a max pool (1) nor a last to-dense (2)");
            RECORD_FUNCTION("spconv_c::maxpool_inference", std::vector<c10::IValue>());
            features = maxpool_inference(rb, features);
        }
        made.push_back(std::move(rb));
    }
    return {features, made, sites, shapes};
}

// Pickling (deepcopy, torch.save, AOT tracing copies): a rulebook is rebuilt from what defines
// it, its input sites and geometry, which gives the same rulebook (builds are deterministic).
// An inverse rulebook is saved as the regular or transposed one it inverts.
using RulebookState = std::tuple<at::Tensor, std::vector<int64_t>>;

RulebookState rulebook_state(const c10::intrusive_ptr<Rulebook> &self) {
    const spconv_rulebook *rb = self->rb;
    const spconv_conv_params *p = spconv_rulebook_params(rb);
    bool inverse = p->kind == SPCONV_CONV_INVERSE;
    int64_t shape[3];
    if (inverse) spconv_rulebook_out_shape(rb, shape);
    else spconv_rulebook_in_shape(rb, shape);
    std::vector<int64_t> ints = {int64_t(spconv_rulebook_forward_kind(rb)),
                                 inverse ? 1 : 0, spconv_rulebook_batch_size(rb)};
    for (const int64_t *v : {static_cast<const int64_t *>(shape), p->kernel, p->stride, p->padding, p->dilation, p->output_padding})
        ints.insert(ints.end(), v, v + 3);
    spconv_tensor *sites = inverse ? spconv_rulebook_out_indices(rb) : spconv_rulebook_in_indices(rb);
    return {borrowed_to_torch(sites).clone(), ints};
}

c10::intrusive_ptr<Rulebook> rulebook_from_state(RulebookState state) {
    const std::vector<int64_t> &v = std::get<1>(state);
    TORCH_CHECK(v.size() == 21, "spconv_c.Rulebook: a saved rulebook has 21 integers, got ", v.size());
    auto three = [&](size_t at) { return std::vector<int64_t>(v.begin() + at, v.begin() + at + 3); };
    auto rb = build_rulebook(std::get<0>(state), three(3), v[2], v[0], three(6), three(9), three(12),
                             three(15), three(18));
    return v[1] ? inverse_rulebook(rb) : rb;
}

} // namespace
} // namespace spconv_c

using namespace spconv_c;

TORCH_LIBRARY(spconv_c, m) {
    m.class_<Rulebook>("Rulebook")
        .def("kind", &Rulebook::kind)
        .def("num_in", &Rulebook::num_in)
        .def("num_out", &Rulebook::num_out)
        .def("num_pairs", &Rulebook::num_pairs)
        .def("kernel_volume", &Rulebook::kernel_volume)
        .def("batch_size", &Rulebook::batch_size)
        .def("kernel", &Rulebook::kernel)
        .def("in_shape", &Rulebook::in_shape)
        .def("out_shape", &Rulebook::out_shape)
        .def("pair_offsets", &Rulebook::pair_offsets)
        .def("pairs_in", &Rulebook::pairs_in)
        .def("pairs_out", &Rulebook::pairs_out)
        .def("in_indices", &Rulebook::in_indices)
        .def("out_indices", &Rulebook::out_indices)
        .def("token", &rulebook_token)
        .def("sites_version", [](const c10::intrusive_ptr<Rulebook> &self) { return self->sites_version; })
        .def("__obj_flatten__", &Rulebook::obj_flatten)
        // A rulebook is not a container: PyTorch's schema checker asks for len() of every
        // argument to find lists of tensors, and 0 says "not one".
        .def("__len__", [](const c10::intrusive_ptr<Rulebook> &) -> int64_t { return 0; })
        .def_pickle([](const c10::intrusive_ptr<Rulebook> &self) { return rulebook_state(self); },
                    [](RulebookState state) { return rulebook_from_state(std::move(state)); })
        // Identity: two handles are equal when they hold the same engine rulebook.
        .def("__eq__", [](const c10::intrusive_ptr<Rulebook> &a, const c10::intrusive_ptr<Rulebook> &b) {
            return a->rb == b->rb;
        });

    m.class_<SequenceRunner>("SequenceRunner")
        .def(torch::init<>())
        .def("run", &run_sequence);

    m.def("build_rulebook(Tensor indices, int[] spatial_shape, int batch_size, int kind, "
          "int[] kernel_size, int[] stride, int[] padding, int[] dilation, int[] output_padding) "
          "-> __torch__.torch.classes.spconv_c.Rulebook");
    m.def("build_rulebook_on(__torch__.torch.classes.spconv_c.Rulebook source, bool output_side, "
          "int kind, int[] kernel_size, int[] stride, int[] padding, int[] dilation, "
          "int[] output_padding) -> (__torch__.torch.classes.spconv_c.Rulebook, Tensor, int[])");
    m.def("inverse_rulebook(__torch__.torch.classes.spconv_c.Rulebook forward) "
          "-> __torch__.torch.classes.spconv_c.Rulebook");
    m.def("conv_forward(__torch__.torch.classes.spconv_c.Rulebook rulebook, Tensor features, "
          "Tensor weight, Tensor? bias) -> Tensor");
    m.def("conv_forward_bn(__torch__.torch.classes.spconv_c.Rulebook rulebook, Tensor features, "
          "Tensor weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, Tensor running_mean, "
          "Tensor running_var, float eps, bool relu, bool krsc=False) -> Tensor");
    m.def("conv_backward(__torch__.torch.classes.spconv_c.Rulebook rulebook, Tensor features, "
          "Tensor weight, Tensor grad_out, bool[] output_mask) -> (Tensor, Tensor, Tensor)");
    m.def("maxpool_forward(__torch__.torch.classes.spconv_c.Rulebook rulebook, Tensor features) "
          "-> (Tensor, Tensor)");
    m.def("maxpool_inference(__torch__.torch.classes.spconv_c.Rulebook rulebook, Tensor features) "
          "-> Tensor");
    m.def("maxpool_backward(__torch__.torch.classes.spconv_c.Rulebook rulebook, Tensor argmax, "
          "Tensor grad_out) -> Tensor");
    m.def("build_subm_token(Tensor indices, int[] spatial_shape, int batch_size, "
          "int[] kernel_size, int[] stride, int[] padding, int[] dilation, int[] output_padding) "
          "-> Tensor");
    m.def("build_rulebook_token(Tensor indices, int[] spatial_shape, int batch_size, int kind, "
          "int[] kernel_size, int[] stride, int[] padding, int[] dilation, int[] output_padding) "
          "-> (Tensor, Tensor)");
    m.def("inverse_token(Tensor forward) -> Tensor");
    m.def("check_sites_token(Tensor token, Tensor indices, int version, str what) -> Tensor");
    m.def("check_lifted_token(Tensor token, Tensor rows, Tensor indices, str what) -> Tensor");
    m.def("token_rulebook(Tensor token) -> __torch__.torch.classes.spconv_c.Rulebook");
    m.def("conv_forward_token(Tensor rulebook, Tensor features, Tensor weight, Tensor? bias) "
          "-> Tensor");
    m.def("conv_backward_token(Tensor rulebook, Tensor features, Tensor weight, Tensor grad_out, "
          "bool[] output_mask) -> (Tensor, Tensor, Tensor)");
    m.def("maxpool_forward_token(Tensor rulebook, Tensor features) -> (Tensor, Tensor)");
    m.def("maxpool_backward_token(Tensor rulebook, Tensor argmax, Tensor grad_out) -> Tensor");
    m.def("avgpool_forward(__torch__.torch.classes.spconv_c.Rulebook rulebook, Tensor features) "
          "-> Tensor");
    m.def("avgpool_backward(__torch__.torch.classes.spconv_c.Rulebook rulebook, Tensor grad_out) "
          "-> Tensor");
    m.def("avgpool_forward_token(Tensor rulebook, Tensor features) -> Tensor");
    m.def("avgpool_backward_token(Tensor rulebook, Tensor grad_out) -> Tensor");
    m.def("sparse_to_dense(Tensor features, Tensor indices, int[] spatial_shape, int batch_size) "
          "-> Tensor");
    m.def("voxelize(Tensor points, float[] voxel_size, float[] coors_range, int max_points, "
          "int max_voxels) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

// One implementation serves CPU and CUDA tensors: the engine dispatches on the tensors' device.
TORCH_LIBRARY_IMPL(spconv_c, CompositeExplicitAutograd, m) {
    m.impl("build_rulebook", &build_rulebook);
    m.impl("build_rulebook_on", &build_rulebook_on);
    m.impl("inverse_rulebook", &inverse_rulebook);
    m.impl("conv_forward", &conv_forward);
    m.impl("conv_forward_bn", &conv_forward_bn);
    m.impl("conv_backward", &conv_backward);
    m.impl("maxpool_forward", &maxpool_forward);
    m.impl("maxpool_inference", &maxpool_inference);
    m.impl("maxpool_backward", &maxpool_backward);
    m.impl("build_subm_token", &build_subm_token);
    m.impl("build_rulebook_token", &build_rulebook_token);
    m.impl("inverse_token", &inverse_token);
    m.impl("check_sites_token", &check_sites_token);
    m.impl("check_lifted_token", &check_lifted_token);
    m.impl("token_rulebook", &token_rulebook);
    m.impl("conv_forward_token", &conv_forward_token);
    m.impl("conv_backward_token", &conv_backward_token);
    m.impl("maxpool_forward_token", &maxpool_forward_token);
    m.impl("maxpool_backward_token", &maxpool_backward_token);
    m.impl("avgpool_forward", &avgpool_forward);
    m.impl("avgpool_backward", &avgpool_backward);
    m.impl("avgpool_forward_token", &avgpool_forward_token);
    m.impl("avgpool_backward_token", &avgpool_backward_token);
    m.impl("sparse_to_dense", &sparse_to_dense);
    m.impl("voxelize", &voxelize);
}
