/* `lockstep env`: what this machine and this process group look like —
 * cores, memory, CPU, the OpenBLAS kernel set, GPUs, the detected process
 * group and its variables, the communicator backends built, and every LK_*
 * variable with its value. The first thing to paste into a bug report. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "backend/isa.h"
#include "cli/cli.h"
#include "device/gpu.h"
#include "lockstep.h"

static void read_field(const char *path, const char *key, char *out, size_t size) {
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen)) continue;
        char *v = strchr(line + klen, ':');
        v = v ? v + 1 : line + klen;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = 0;
        snprintf(out, size, "%s", v);
        break;
    }
    fclose(f);
}

/* GPUs as the CUDA runtime sees them (name, compute capability, memory),
 * then NVML's live stats when the driver's library is there. Neither being
 * present is normal on a CPU machine: one line says why. */
static void gpus(void) {
    int n = lk__cuda_visible();
    if (n == 0) {
        printf("gpus            : %s\n", lk__cuda_why_none());
    } else {
        printf("gpus            : %d visible to CUDA\n", n);
        for (int i = 0; i < n; i++) {
            lk__cuda_props p;
            if (lk__cuda_props_get(i, &p)) printf("  cuda:%d (properties unreadable: %s)\n", i, lk_last_error());
            else
                printf("  cuda:%d %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free)\n", i, p.name, p.major,
                       p.minor, p.multiprocessors, p.mem_total / 1073741824.0, p.mem_free / 1073741824.0);
        }
    }
    char why[256];
    if (!lk__nvml_available(why, sizeof why)) {
        printf("gpu stats (nvml): not available: %s\n", why);
        return;
    }
    int m = lk__nvml_count();
    printf("gpu stats (nvml): %d GPU%s on this machine\n", m, m == 1 ? "" : "s");
    for (int i = 0; i < m; i++) {
        lk__gpu_stats st;
        if (lk__nvml_stats(i, &st)) {
            printf("  %d: %s\n", i, lk_last_error());
            continue;
        }
        printf("  %d: %s, utilization %d%%, memory %.1f / %.1f GiB, %d C", i, st.name, st.utilization_pct,
               st.mem_used / 1073741824.0, st.mem_total / 1073741824.0, st.temperature_c);
        if (st.power_w >= 0) printf(", %.0f W", st.power_w);
        printf("\n");
    }
}

int lk_cmd_env(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: lockstep env\n\nPrints the hardware, the process group detected from the environment,\n"
               "the communicator backends built and the LK_* variables.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "lockstep env: unexpected argument '%s' (it takes none)\n", argv[1]);
        return 2;
    }
    char model[256], mem[128];
    read_field("/proc/cpuinfo", "model name", model, sizeof model);
    read_field("/proc/meminfo", "MemTotal", mem, sizeof mem);
    printf("lockstep        : %s\n", LK_VERSION_STRING);
    printf("cpu             : %s\n", model[0] ? model : "unknown");
    printf("cores           : %ld online (%ld configured)\n", sysconf(_SC_NPROCESSORS_ONLN), sysconf(_SC_NPROCESSORS_CONF));
    long kb = atol(mem);
    printf("memory          : %.1f GiB\n", (double)kb / (1024.0 * 1024.0));
    printf("compute threads : %d per process (LK_NUM_THREADS; a trainer uses cores / local ranks)\n",
           lk_get_num_threads());
    char caps[256];
    printf("cpu low-prec.   : %s\n", lk_cpu_lowp_features(caps, sizeof caps));
    printf("cpu loops       : %s (build: %s; LK_CPU_ISA=auto|avx512|avx2|baseline lowers it)\n",
           lk__cpu_isa_name(lk__cpu_isa()), lk__cpu_isa_build());
    printf("32-true GEMM    : %s (LK_F32_GEMM=auto|onednn|openblas)\n", lk_autocast_gemm_path(LK_F32));
    printf("bf16-mixed GEMM : %s\n", lk_autocast_gemm_path(LK_BF16));
    printf("16-mixed GEMM   : %s\n", lk_autocast_gemm_path(LK_F16));
    printf("blas            : OpenBLAS, core %s, single-threaded (lockstep splits GEMMs), config: %s\n",
           openblas_get_corename(), openblas_get_config());
    gpus();

    lk_pg_info pg;
    char desc[256];
    if (lk_pg_info_from_env(&pg)) {
        printf("process group   : INVALID: %s\n", lk_last_error());
    } else {
        lk_pg_info_format(&pg, desc, sizeof desc);
        printf("process group   : %s\n", desc);
        if (pg.master_addr[0] || pg.master_port) printf("rendezvous      : %s:%d\n", pg.master_addr, pg.master_port);
    }
    static const char *vars[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                 "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_LOCALID",
                                 "SLURM_NTASKS", "SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_ID"};
    int shown = 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (!v) continue;
        printf("%s %s=%s\n", shown++ ? "                 " : "variables       :", vars[i], v);
    }
    printf("comm backends   :");
    for (int i = 0; i < lk_comm_backend_count(); i++) printf(" %s", lk_comm_backend_name_at(i));
    printf("\n");
    bool mpirun = !system("command -v mpirun >/dev/null 2>&1");
    printf("mpirun          : %s\n", mpirun ? "found" : "not found");
    int n = 0;
    const lk_env_var *ev = lk_env_vars(&n);
    printf("LK_* variables  :\n");
    for (int i = 0; i < n; i++) {
        const char *v = getenv(ev[i].name);
        printf("  %-18s = %-10s %s%s%s\n", ev[i].name, v ? v : (ev[i].default_value ? ev[i].default_value : "-"),
               v ? "(set)" : "(default)", ev[i].help ? "  " : "", ev[i].help ? ev[i].help : "");
    }
    /* dist tunables not (yet) in the core table: shown when set */
    const char *extra[] = {"LK_COMM_SHM_BYTES", "LK_COMM_CHECK_DESYNC", "LK_COMM_SHM_SMALL", "LK_COMM_SHM_SLICE"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        bool declared = false;
        for (int j = 0; j < n; j++) declared |= !strcmp(ev[j].name, extra[i]);
        const char *v = getenv(extra[i]);
        if (!declared && v) printf("  %-18s = %s (set)\n", extra[i], v);
    }
    return 0;
}
