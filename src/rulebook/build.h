/* The kind-specific halves of spconv_rulebook_build (build.c validates and dispatches). */
#ifndef SPCONV_RULEBOOK_BUILD_H
#define SPCONV_RULEBOOK_BUILD_H

#include <stdint.h>

#include "rulebook/internal.h"
#include "rulebook/sites.h"

/* What every builder gets: the input rows (validated by build.c for the strided builders, by
 * spconv__build_subm itself for subm). */
typedef struct spconv__build_input {
    const char *func;
    int num_threads;
    const int32_t *rows; /* contiguous [num_in, 4] */
    int64_t num_in;
    const spconv__site_table *sites; /* the subm table build's own table; NULL otherwise */
    const int64_t *shape;            /* the input's spatial shape */
    int64_t batch_size;
    /* 1 when the caller knows the rows to be in range and unique for this shape and batch size
     * (spconv__rulebook_build_sites): the strided builders then skip their own checks. */
    int rows_valid;
} spconv__build_input;

/* Fill rb's outputs, offsets and pairs for a SUBM rulebook (rb's geometry is already set),
 * validating the rows first (through the line index when the grid suits it, else the table). */
spconv_status spconv__build_subm(const spconv__build_input *in, spconv_rulebook *rb);

/* The same for REGULAR and TRANSPOSED rulebooks: outputs sorted by (b, z, y, x); the rows are
 * validated with the site table's messages too (from the sorted candidates where windows do not
 * overlap, else by spconv__validate_rows). */
spconv_status spconv__build_strided(const spconv__build_input *in, spconv_rulebook *rb);

/* Rows in range and unique, with the site table's messages (sites.h): through a line index when
 * the grid's lines are few next to the rows, else through the table. */
spconv_status spconv__validate_rows(const spconv__build_input *in);

#endif /* SPCONV_RULEBOOK_BUILD_H */
