/**
 * @file types.h
 * @brief Element types and devices shared by every module.
 */
#ifndef SPCONV_TYPES_H
#define SPCONV_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Element type of a tensor. The numbers are stable. */
typedef enum spconv_dtype {
    SPCONV_F16 = 0,  /**< IEEE binary16 */
    SPCONV_BF16 = 1, /**< bfloat16 (upper half of a binary32) */
    SPCONV_F32 = 2,
    SPCONV_F64 = 3,
    SPCONV_I32 = 4,
    SPCONV_I64 = 5,
    SPCONV_U8 = 6
} spconv_dtype;

#define SPCONV_DTYPE_COUNT 7

/** Bytes per element; 0 for a value that is not a dtype. */
size_t spconv_dtype_size(spconv_dtype dtype);
/** "f32", "bf16", ...; "invalid" for a value that is not a dtype. */
const char *spconv_dtype_name(spconv_dtype dtype);
/** 1 for f16, bf16, f32, f64. */
int spconv_dtype_is_floating(spconv_dtype dtype);

typedef enum spconv_device_type {
    SPCONV_DEVICE_CPU = 0,
    SPCONV_DEVICE_CUDA = 1
} spconv_device_type;

/** A device: its type and, for CUDA, the ordinal (always 0 for the CPU). */
typedef struct spconv_device {
    spconv_device_type type;
    int index;
} spconv_device;

/** The CPU device. */
static inline spconv_device spconv_cpu(void) {
    spconv_device d = {SPCONV_DEVICE_CPU, 0};
    return d;
}
/** CUDA device number @p index. */
static inline spconv_device spconv_cuda(int index) {
    spconv_device d = {SPCONV_DEVICE_CUDA, index};
    return d;
}
/** 1 when both name the same device. */
static inline int spconv_device_equal(spconv_device a, spconv_device b) {
    return a.type == b.type && a.index == b.index;
}

/** Round-to-nearest-even conversions between float and the 16-bit formats (NaN stays NaN). */
uint16_t spconv_f32_to_f16(float value);
float spconv_f16_to_f32(uint16_t bits);
uint16_t spconv_f32_to_bf16(float value);
float spconv_bf16_to_f32(uint16_t bits);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_TYPES_H */
