/* The test oracle for spconv_rulebook_build: a brute-force builder that checks the geometry rule
 * of docs/design.md directly for every (input site, output site) pair. Quadratic; for small inputs. */
#ifndef SPCONV_RULEBOOK_REF_H
#define SPCONV_RULEBOOK_REF_H

#include <stdint.h>

#include "spconv/rulebook.h"

/**
 * Same contract and canonical result as spconv_rulebook_build (REGULAR, SUBM, TRANSPOSED), built
 * single-threaded by exhaustive checks: rows validated one by one against every earlier row,
 * output sites enumerated over the output grid in (b, z, y, x) order, pairs found by testing
 * every input against every output. *out has one reference.
 */
spconv_status spconv__rulebook_build_ref(const spconv_tensor *indices,
                                         const int64_t spatial_shape[3], int64_t batch_size,
                                         const spconv_conv_params *params, spconv_rulebook **out);

#endif /* SPCONV_RULEBOOK_REF_H */
