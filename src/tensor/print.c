/* Debug output: a one-line description and (small) contents in nested brackets. */
#include <inttypes.h>
#include <stdio.h>

#include "core/error.h"
#include "tensor/convert.h"
#include "tensor/geometry.h"
#include "tensor/tensor_impl.h"

void spconv_tensor_describe(const spconv_tensor *t, char *buf, size_t buflen) {
    if (buf == NULL || buflen == 0) return;
    if (t == NULL) {
        snprintf(buf, buflen, "tensor NULL");
        return;
    }
    spconv_device device = t->storage->device;
    char device_name[24];
    if (device.type == SPCONV_DEVICE_CPU)
        snprintf(device_name, sizeof device_name, "cpu");
    else
        snprintf(device_name, sizeof device_name, "cuda:%d", device.index);
    snprintf(buf, buflen, "tensor %s %s %s strides %s offset %" PRId64 " %s",
             spconv_dtype_name(t->dtype), device_name, spconv__dims_str(t->ndim, t->sizes).text,
             spconv__dims_str(t->ndim, t->strides).text, t->offset,
             t->is_contiguous ? "contiguous" : "non-contiguous");
}

static void print_element(FILE *stream, const char *element, spconv_dtype dtype) {
    if (spconv_dtype_is_floating(dtype))
        fprintf(stream, "%.6g", spconv__load_floating(element, dtype));
    else
        fprintf(stream, "%" PRId64, spconv__load_integer(element, dtype));
}

/* Print dims `dim`.. of the host tensor `t` starting at `element`, while *budget lasts; an
 * element cut off by the budget shows as "...". */
static void print_dims(FILE *stream, const spconv_tensor *t, int dim, const char *element,
                       int64_t *budget) {
    if (dim == t->ndim) {
        print_element(stream, element, t->dtype);
        --*budget;
        return;
    }
    int64_t step = t->strides[dim] * (int64_t)spconv__tensor_element_size(t);
    fputc('[', stream);
    for (int64_t i = 0; i < t->sizes[dim]; ++i) {
        if (i > 0) fputs(", ", stream);
        if (*budget == 0) {
            fputs("...", stream);
            break;
        }
        print_dims(stream, t, dim + 1, element + i * step, budget);
    }
    fputc(']', stream);
}

spconv_status spconv_tensor_print(spconv_context *ctx, const spconv_tensor *t, FILE *stream,
                                  int64_t max_elements) {
    static const char func[] = "spconv_tensor_print";
    SPCONV_CHECK_NOT_NULL(func, t);
    SPCONV_CHECK_NOT_NULL(func, stream);
    SPCONV_RETURN_ERROR_IF(max_elements < 0, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: max_elements = %" PRId64 " is negative", func, max_elements);
    char line[512];
    spconv_tensor_describe(t, line, sizeof line);
    fprintf(stream, "%s\n", line);
    if (max_elements > 0 && t->numel == 0) fputs("[]\n", stream);
    if (max_elements > 0 && t->numel > 0) {
        /* Host tensors are read in place, through their strides; others are fetched once. */
        spconv_tensor *host = (spconv_tensor *)t;
        if (t->storage->device.type == SPCONV_DEVICE_CPU)
            spconv_tensor_retain(host);
        else
            SPCONV_FORWARD_IF_ERROR(spconv_tensor_to_device(ctx, t, spconv_cpu(), &host));
        print_dims(stream, host, 0, spconv_tensor_data(host), &max_elements);
        fputc('\n', stream);
        spconv_tensor_release(host);
    }
    SPCONV_RETURN_ERROR_IF(ferror(stream), SPCONV_ERR_IO, "%s: writing to the stream failed", func);
    return SPCONV_OK;
}
