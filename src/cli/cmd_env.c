/* `lockstep env`: what this machine and this process group look like —
 * cores, memory, CPU, the OpenBLAS kernel set, GPUs, the detected process
 * group and its variables, the communicator backends built, every LK_*
 * variable with its value, and the settings a variable can also give with
 * their effective values and sources (given the config files and overrides
 * of a fit, the keys they set win). The first thing to paste into a bug
 * report. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "backend/cpu/gemm_small.h"
#include "backend/isa.h"
#include "backend/threads.h"
#include "cli/cli.h"
#include "device/gpu.h"
#include "lockstep.h"
#include "lockstep/config.h"
#include "lockstep/trainer.h"

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

static int settings(const lk_config *cfg);


/* Where lockstep's own f32 kernel (src/backend/cpu/gemm_small.c) stands in
 * for OpenBLAS on the 32-true path: LK_GEMM's mode and, under auto, the
 * rule for this CPU's level (gemm.c). */
static const char *own_gemm(void) {
    switch (lk__cpu_gemm_mode()) {
    case LK__GEMM_OWN: return "every f32 GEMM of OpenBLAS's path and attention's tiles";
    case LK__GEMM_BLAS: return "none: OpenBLAS runs every f32 GEMM of its path, attention's tiles included";
    default:
        return lk__cpu_gemm_rule_level() >= LK_ISA_AVX512
                   ? "attention's tiles, and on this AVX-512 CPU the forward and input gradients from 128 rows "
                     "and the weight gradients from 256 (K <= 4096), in place of OpenBLAS"
                   : "attention's tiles and the linears of >= 512 rows with K <= 512, in place of OpenBLAS";
    }
}
static int env_report(const lk_config *cfg) {
    char model[256], mem[128];
    read_field("/proc/cpuinfo", "model name", model, sizeof model);
    read_field("/proc/meminfo", "MemTotal", mem, sizeof mem);
    printf("lockstep        : %s\n", LK_VERSION_STRING);
    printf("cpu             : %s\n", model[0] ? model : "unknown");
    printf("cores           : %ld online (%ld configured)\n", sysconf(_SC_NPROCESSORS_ONLN), sysconf(_SC_NPROCESSORS_CONF));
    long kb = atol(mem);
    printf("memory          : %.1f GiB\n", (double)kb / (1024.0 * 1024.0));
    printf("compute threads : %d per process (%s; a trainer gives each rank its share of the %d CPUs this process "
           "may use)\n", lk_get_num_threads(), lk__num_threads_from(), lk__cpus_available());
    char caps[256];
    printf("cpu low-prec.   : %s\n", lk_cpu_lowp_features(caps, sizeof caps));
    printf("cpu loops       : %s (build: %s; LK_CPU_ISA=auto|avx512|avx2|baseline lowers it)\n",
           lk__cpu_isa_name(lk__cpu_isa()), lk__cpu_isa_build());
    printf("32-true GEMM    : %s (LK_F32_GEMM=auto|onednn|openblas)\n", lk_autocast_gemm_path(LK_F32));
    printf("own f32 GEMM    : %s (LK_GEMM=auto|own|blas)\n", own_gemm());
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
        printf("  %-18s = %-10s %s%s%s%s%s%s\n", ev[i].name, v ? v : (ev[i].default_value ? ev[i].default_value : "-"),
               v ? "(set)" : "(default)", ev[i].help ? "  " : "", ev[i].help ? ev[i].help : "",
               ev[i].setting ? " [" : "", ev[i].setting ? ev[i].setting : "", ev[i].setting ? " wins when set]" : "");
    }
    /* dist tunables not (yet) in the core table: shown when set */
    const char *extra[] = {"LK_COMM_SHM_BYTES", "LK_COMM_CHECK_DESYNC", "LK_COMM_SHM_SMALL", "LK_COMM_SHM_SLICE"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        bool declared = false;
        for (int j = 0; j < n; j++) declared |= !strcmp(ev[j].name, extra[i]);
        const char *v = getenv(extra[i]);
        if (!declared && v) printf("  %-18s = %s (set)\n", extra[i], v);
    }
    return settings(cfg);
}

/* One line of the settings section: "name = value (from SOURCE)", or
 * "(default...)" when nothing set it. */
static void setting(const char *name, const char *value, const char *from, const char *note) {
    bool def = !strcmp(from, "default");
    printf("  %-14s = %s (%s%s%s%s)\n", name, value, def ? "default" : "from ", def ? "" : from, note ? "; " : "",
           note ? note : "");
}

/* The settings an LK_* variable can also give: their effective values and
 * where each came from, under the one rule (core.h, lk_env_var): a key
 * the config sets wins over the variable, which wins over the default.
 * `cfg` is the config given to this command (-c files, --key overrides:
 * those of the fit it stands for). */
static int settings(const lk_config *cfg) {
    lk_trainer_config tc;
    if (lk_trainer_config_default(&tc) || lk_trainer_config_apply(lk_config_get(cfg, "trainer"), &tc)) {
        fprintf(stderr, "lockstep env: error: %s\n", lk_last_error());
        return 2;
    }
    char v[LK_PARAM_STR + 64], from[LK_PARAM_STR], note[256];
    printf("settings        : effective values; a key the config sets wins over its LK_* variable, which wins "
           "over the default\n");
    snprintf(v, sizeof v, "%g", tc.comm_timeout);
    setting("comm_timeout", v, lk_trainer_config_comm_timeout_from(&tc, from, sizeof from), NULL);

    /* Threads per rank: ranks already launched share this node as the
     * launcher said; a fit started here launches trainer.devices ranks. */
    lk_pg_info pg;
    int local = 1;
    bool launched = !lk_pg_info_from_env(&pg) && pg.world_size > 1;
    if (launched) local = pg.local_world_size;
    else if (tc.devices > 1 && (!lk_strategy_info_get(tc.strategy) ||
                                lk_strategy_info_get(tc.strategy)->process_model == LK_PROCESS_PER_DEVICE))
        local = (int)tc.devices; /* a process per device */
    lk_clear_error(); /* an invalid process group is reported above */
    const char *tfrom;
    int threads = lk__threads_preview(local, &tfrom);
    int cpus = lk__cpus_available();
    snprintf(v, sizeof v, "%d", threads);
    snprintf(note, sizeof note, "a rank's share: %d CPU%s this process may use / %d rank%s on this node", cpus,
             cpus == 1 ? "" : "s", local, local == 1 ? "" : "s");
    bool capped = strcmp(tfrom, "default") && atol(getenv("LK_NUM_THREADS")) != threads;
    if (capped)
        snprintf(note, sizeof note, "it asks for %s; a rank's share of the %d CPU%s is %d", getenv("LK_NUM_THREADS"),
                 cpus, cpus == 1 ? "" : "s", threads);
    setting("num_threads", v, tfrom, strcmp(tfrom, "default") && !capped ? NULL : note);

    const char *forced = lk_env_get("LK_COMM_BACKEND");
    bool by_env = forced && *forced && strcmp(forced, "auto");
    setting("comm_backend", by_env ? forced : "auto", by_env ? "LK_COMM_BACKEND" : "default",
            by_env ? NULL : "self for one process, shm on one node, hier across nodes (mpi with one rank per node), nccl between GPUs");

    const lk_config_node *root = lk_config_get(cfg, "data.init_args.root");
    const char *rt = lk_config_node_text(root);
    if (rt && *rt && !lk_config_node_is_null(root)) {
        setting("data_root", rt, lk_config_node_origin(root, "data.init_args.root", from, sizeof from), NULL);
    } else if (lk_env_is_set("LK_DATA_ROOT")) {
        setting("data_root", getenv("LK_DATA_ROOT"), "LK_DATA_ROOT", "then $LK_DATA_ROOT/fashion-mnist");
    } else {
        setting("data_root", "/usr/share/datasets/fashion-mnist", "default", "the dataset-fashion-mnist package");
    }

    const char *rfrom;
    snprintf(v, sizeof v, "%d", lk_cli_max_restarts_from_env(&rfrom));
    setting("max_restarts", v, rfrom, "lockstep fit with devices > 1, and lockstep launch without --max-restarts");

    static const char *const levels[] = {"debug", "info", "warn", "error", "off"};
    setting("log_level", levels[lk_log_get_level()], lk__log_level_from(), NULL);
    return 0;
}

int lk_cmd_env(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: lockstep env [-c CONFIG.yaml]... [--SECTION.KEY VALUE]...\n\n"
               "Prints the hardware, the process group detected from the environment,\n"
               "the communicator backends built, the settings an LK_* variable can also\n"
               "give (their effective values and where each came from) and the LK_*\n"
               "variables. Config files and overrides, as `lockstep fit` takes them,\n"
               "show which of their keys win over a variable.\n");
        return 0;
    }
    lk_config_args args;
    if (lk_config_args_parse(argc - 1, argv + 1, NULL, 0, &args)) {
        fprintf(stderr, "lockstep env: error: %s\n", lk_last_error());
        return 2;
    }
    if (args.nrest > 0) {
        fprintf(stderr, "lockstep env: unexpected argument '%s' (it takes -c files and --key overrides only)\n",
                args.rest[0]);
        lk_config_args_free(&args);
        return 2;
    }
    lk_config *cfg = lk_config_create();
    if (!cfg || lk_config_load_args(cfg, &args)) {
        fprintf(stderr, "lockstep env: error: %s\n", cfg ? lk_last_error() : "out of memory");
        lk_config_free(cfg);
        lk_config_args_free(&args);
        return 2;
    }
    /* A config the settings cannot read is refused before anything is printed */
    lk_trainer_config tc;
    if (lk_trainer_config_default(&tc) || lk_trainer_config_apply(lk_config_get(cfg, "trainer"), &tc)) {
        fprintf(stderr, "lockstep env: error: %s\n", lk_last_error());
        lk_config_free(cfg);
        lk_config_args_free(&args);
        return 2;
    }
    int rc = env_report(cfg);
    lk_config_free(cfg);
    lk_config_args_free(&args);
    return rc;
}
