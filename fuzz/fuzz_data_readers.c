/* libFuzzer target for the file readers (idx/idx.gz, npy, csv, tokens): the
 * first byte picks the reader, the rest is the file. Any input must give a
 * clean status, never a crash, hang or leak. fuzz/run.sh builds and runs it;
 * seeds in fuzz/corpus/fuzz_data_readers/ (first byte: 0 idx, 1 npy, 2 csv,
 * 3 tokens, 4 npy dataset). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lockstep.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("lk_fuzz", 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        lk_log_set_level(LK_LOG_OFF);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data + 1, size - 1, 0) != (ssize_t)(size - 1)) return 0;
    lk_array a, b;
    lk_dataset *ds = NULL;
    switch (data[0] % 5) {
    case 0:
        if (!lk_idx_read(path, &a)) lk_array_release(&a);
        break;
    case 1:
        if (!lk_npy_read(path, &a)) lk_array_release(&a);
        break;
    case 2: {
        lk_csv_config c = lk_csv_config_default();
        c.header = (data[0] >> 3) % 3 - 1;
        if (!lk_csv_read(path, &c, &a, &b)) {
            lk_array_release(&a);
            lk_array_release(&b);
        }
        break;
    }
    case 3: {
        lk_tokens_config c = lk_tokens_config_default();
        c.seq_len = 1 + (data[0] >> 3);
        c.vocab_size = 50257;
        if (!lk_dataset_tokens_create(path, &c, &ds)) {
            int64_t x[64], y[64];
            lk_dataset_get(ds, lk_dataset_len(ds) - 1, 0, (void *[]){x, y});
            lk_dataset_free(ds);
        }
        break;
    }
    case 4:
        if (!lk_dataset_npy_create(path, NULL, &ds)) lk_dataset_free(ds);
        break;
    }
    return 0;
}
