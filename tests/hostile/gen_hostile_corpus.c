/* gen_hostile_corpus DIR: write the hostile-input corpus (corpus.h) into the folder DIR, which must
 * exist, to look at the files or seed a fuzzer with them. */
#include <stdio.h>

#include "hostile/corpus.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_hostile_corpus DIR\n");
        return 2;
    }
    return hostile_corpus_write(argv[1]) == 0 ? 0 : 1;
}
