/* Files written atomically: mkdir -p, the write-to-"<path>.tmp.<pid>",
 * fsync, rename sequence every output file of a run goes through (logs,
 * run info, profiles, images, the saved config), and the clean-up of the
 * temporaries a writer leaves when its process dies before the rename.
 * They live in core because every layer that writes a file needs the same
 * all-or-nothing contract; which directories a run owns (version_N,
 * checkpoints) stays with the trainer's loggers. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lockstep/core.h"

lk_status lk_file_mkdirs(const char *path) {
    if (!path || !path[0]) return lk_error(LK_STATUS_INVALID_ARGUMENT, "mkdirs: empty path");
    char buf[LK_FILE_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "mkdirs: path too long (%zu bytes): %.64s...", strlen(path), path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return lk_error(LK_STATUS_IO, "cannot create directory %s: %s", buf, strerror(errno));
        struct stat sb;
        if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return lk_error(LK_STATUS_IO, "cannot create directory %s: a file of that name exists", buf);
        *p = c;
        if (!c) break;
    }
    return LK_STATUS_OK;
}

lk_status lk_file_write_all(int fd, const char *path, const void *data, size_t len) {
    const char *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return lk_error(LK_STATUS_IO, "cannot write %s: %s", path, w < 0 ? strerror(errno) : "short write");
        p += w;
        len -= (size_t)w;
    }
    return LK_STATUS_OK;
}

lk_status lk_file_write_atomic(const char *path, const void *data, size_t len) {
    char tmp[LK_FILE_PATH_MAX + 32];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "path too long: %.64s...", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return lk_error(LK_STATUS_IO, "cannot create %s: %s", tmp, strerror(errno));
    lk_status st = lk_file_write_all(fd, tmp, data, len);
    if (!st && fsync(fd) != 0) st = lk_error(LK_STATUS_IO, "cannot sync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !st) st = lk_error(LK_STATUS_IO, "cannot close %s: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = lk_error(LK_STATUS_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st) unlink(tmp);
    return st;
}

/* True when name is "<something>.tmp.<pid>" (what lk_file_write_atomic and
 * the safetensors writer leave when their process dies between create and
 * rename) and that pid is not running on this machine. A live pid, even an
 * unrelated process that reused the number, keeps its file: removing a
 * file some writer still owns would be worse than leaving a stale one. */
static bool stale_tmp(const char *name) {
    const char *t = strstr(name, ".tmp.");
    if (!t || t == name) return false;
    while (strstr(t + 1, ".tmp.")) t = strstr(t + 1, ".tmp.");
    const char *d = t + 5;
    if (!*d) return false;
    long pid = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9' || pid > 4194304) return false;
        pid = pid * 10 + (*d - '0');
    }
    if (pid <= 0 || pid == (long)getpid()) return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int lk_file_remove_stale_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    char path[LK_FILE_PATH_MAX + 300];
    while ((e = readdir(d))) {
        if (!stale_tmp(e->d_name)) continue;
        struct stat sb;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (unlink(path) == 0) n++;
    }
    closedir(d);
    return n;
}
