/* Runs a libFuzzer target's entry point over every file in the directories
 * given on the command line, without libFuzzer: the committed corpus (and
 * the regression inputs in it) thereby run in the ordinary test suite, under
 * ASan too, on compilers that have no libFuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    int files = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (!d) {
            fprintf(stderr, "replay: cannot open directory %s\n", argv[a]);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            FILE *f = fopen(path, "rb");
            if (!f) continue;
            fseek(f, 0, SEEK_END);
            long n = ftell(f);
            fseek(f, 0, SEEK_SET);
            uint8_t *buf = malloc((size_t)n + 1);
            size_t got = fread(buf, 1, (size_t)n, f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, got); /* traps on a broken property */
            free(buf);
            files++;
        }
        closedir(d);
    }
    printf("replay: %d inputs ok\n", files);
    return files ? 0 : 1;
}
