/* Element types: sizes, names and the public 16-bit float conversions (rules in convert.h). */
#include "spconv/types.h"
#include "tensor/convert.h"

size_t spconv_dtype_size(spconv_dtype dtype) {
    switch (dtype) {
    case SPCONV_F16:
    case SPCONV_BF16: return 2;
    case SPCONV_F32:
    case SPCONV_I32: return 4;
    case SPCONV_F64:
    case SPCONV_I64: return 8;
    case SPCONV_U8: return 1;
    }
    return 0;
}

const char *spconv_dtype_name(spconv_dtype dtype) {
    switch (dtype) {
    case SPCONV_F16: return "f16";
    case SPCONV_BF16: return "bf16";
    case SPCONV_F32: return "f32";
    case SPCONV_F64: return "f64";
    case SPCONV_I32: return "i32";
    case SPCONV_I64: return "i64";
    case SPCONV_U8: return "u8";
    }
    return "invalid";
}

int spconv_dtype_is_floating(spconv_dtype dtype) {
    return dtype == SPCONV_F16 || dtype == SPCONV_BF16 || dtype == SPCONV_F32 || dtype == SPCONV_F64;
}

uint16_t spconv_f32_to_f16(float value) { return spconv__f32_to_f16(value); }

float spconv_f16_to_f32(uint16_t bits) { return spconv__f16_to_f32(bits); }

uint16_t spconv_f32_to_bf16(float value) { return spconv__f32_to_bf16(value); }

float spconv_bf16_to_f32(uint16_t bits) { return spconv__bf16_to_f32(bits); }
