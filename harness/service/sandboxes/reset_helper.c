/* The grading reset for exec-only backends, as one static binary (harness/service/sandboxes/grading.py).
 *
 * Why C and static: on docker, e2b, modal and daytona the agent has been root over the image, so
 * its rm, kill, chmod, stat, sed or its libc may lie. This helper needs nothing from the image:
 * grading.py compiles it on the host with `gcc -static`, uploads it through the backend's file
 * API and runs it. It only uses system calls.
 *
 *   reset-helper baseline HOOK...
 *       one line per live, non-zombie process ("PID:STARTTIME") but its own, and one per HOOK
 *       file present ("hook:PATH:SIGNATURE")
 *   reset-helper reset --keep ENTRY... --hooks HOOK... --paths PATH MODE WIPE...
 *       SIGKILL every process not in ENTRY (nor its own ancestors: the backend's exec daemon)
 *       until none is left; /dev's links and basic nodes put back; each PATH made a real dir
 *       with MODE (octal), emptied when WIPE is 1; each HOOK that differs from its ENTRY removed.
 *       Prints "killed N", "survivor PID", "found WHAT", "error WHAT" and
 *       "free BLOCKS BLOCKSIZE INODES" (of /), the lines grading.py reads.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define MAX_PROCS 65536

/* "PID:STARTTIME" of a live, non-zombie process into out; 0 when it is gone or a zombie. */
static int proc_entry(long pid, char *out, size_t size, long *ppid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *rest = strrchr(buf, ')');  /* the command name may hold spaces and ')' */
    if (!rest || rest[1] != ' ') return 0;
    rest += 2;
    char *save = NULL, *tok = strtok_r(rest, " ", &save);
    char state = tok ? tok[0] : 0;
    if (state == 'Z' || state == 'X' || !tok) return 0;
    for (int i = 1; i <= 19; i++) {
        tok = strtok_r(NULL, " ", &save);
        if (!tok) return 0;
        if (i == 1 && ppid) *ppid = strtol(tok, NULL, 10);
    }
    snprintf(out, size, "%ld:%s", pid, tok);  /* field 22: the start time */
    return 1;
}

typedef struct { long pid; char entry[48]; } proc_t;

static int list_procs(proc_t *procs, int max) {
    DIR *d = opendir("/proc");
    if (!d) return -1;
    int n = 0;
    long self = getpid();
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == self) continue;
        if (proc_entry(pid, procs[n].entry, sizeof procs[n].entry, NULL)) procs[n++].pid = pid;
    }
    closedir(d);
    return n;
}

/* FNV-1a over the file's bytes: a changed hook file shows as a changed signature. */
static void hook_sig(const char *path, char *out, size_t size) {
    struct stat st;
    out[0] = 0;
    if (lstat(path, &st) != 0) return;
    if (S_ISLNK(st.st_mode)) { snprintf(out, size, "hook:%s:link", path); return; }
    if (S_ISDIR(st.st_mode)) { snprintf(out, size, "hook:%s:dir", path); return; }
    uint64_t h = 1469598103934665603ULL;
    long long total = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0 && S_ISREG(st.st_mode)) {
        unsigned char buf[65536];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0) {
            for (ssize_t i = 0; i < n; i++) { h ^= buf[i]; h *= 1099511628211ULL; }
            total += n;
        }
    }
    if (fd >= 0) close(fd);
    snprintf(out, size, "hook:%s:%016llx-%lld-%o", path, (unsigned long long)h, total,
             (unsigned)(st.st_mode & S_IFMT));
}

/* rm -rf below an open dir: each dir made 0700 first (the agent may have locked it). */
static int remove_at(int dirfd, const char *name) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlinkat(dirfd, name, 0);
    fchmodat(dirfd, name, 0700, 0);
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return -1; }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (remove_at(fd, e->d_name) != 0) rc = -1;
    }
    closedir(d);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0) rc = -1;
    return rc;
}

static int remove_path(const char *path) { return remove_at(AT_FDCWD, path); }

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void mkdir_p(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') { *p = 0; mkdir(buf, 0755); *p = '/'; }
    }
    mkdir(buf, 0755);
}

static void fix_dir(const char *path, unsigned mode, int wipe) {
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        char target[4096] = "";
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n > 0) target[n] = 0;
        printf("found %s was a symlink to '%s'\n", path, target);
        unlink(path);
    } else if (lstat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
        printf("found %s was not a dir\n", path);
        unlink(path);
    }
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        unsigned m = st.st_mode & 07777;
        if (((m >> 6) & 7) != 7) printf("found %s was locked (mode %o)\n", path, m);
        if (wipe) {
            chmod(path, m | 0700);
            DIR *d = opendir(path);
            char *names[4096];
            int n = 0, total = 0;
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                if (n < 4096) names[n++] = strdup(e->d_name);
                total++;
            }
            if (d) closedir(d);
            if (total > 0) {
                qsort(names, n, sizeof *names, cmp_str);
                printf("found %s held %d entries: ", path, total);
                for (int i = 0; i < n && i < 5; i++) printf(i ? ", %s" : "%s", names[i]);
                printf("\n");
                if (remove_path(path) != 0) printf("error %s: could not be emptied\n", path);
            }
            for (int i = 0; i < n; i++) free(names[i]);
        }
    }
    mkdir_p(path);
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || chmod(path, mode) != 0)
        printf("error %s: could not be reset\n", path);
}

/* /dev as the grader's shells expect it: a planted /dev/fd makes `diff <(a) <(b)` read the
 * agent's files; a regular file at /dev/null keeps what the grader discards. */
static void fix_dev(void) {
    static const char *links[][2] = {{"/dev/fd", "/proc/self/fd"},
                                     {"/dev/stdin", "/proc/self/fd/0"},
                                     {"/dev/stdout", "/proc/self/fd/1"},
                                     {"/dev/stderr", "/proc/self/fd/2"}};
    static const struct { const char *path; unsigned maj, min; } nodes[] = {
        {"/dev/null", 1, 3}, {"/dev/zero", 1, 5}, {"/dev/full", 1, 7},
        {"/dev/random", 1, 8}, {"/dev/urandom", 1, 9}};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
        char target[256] = "";
        ssize_t n = readlink(links[i][0], target, sizeof target - 1);
        if (n > 0) target[n] = 0;
        if (n > 0 && !strcmp(target, links[i][1])) continue;
        struct stat st;
        if (lstat(links[i][0], &st) != 0 && errno == ENOENT) {
            printf("found %s was removed\n", links[i][0]);
        } else {
            printf("found %s was replaced\n", links[i][0]);
            remove_path(links[i][0]);
        }
        if (symlink(links[i][1], links[i][0]) != 0)
            printf("error %s: could not be put back\n", links[i][0]);
    }
    for (size_t i = 0; i < sizeof nodes / sizeof *nodes; i++) {
        struct stat st;
        dev_t want = makedev(nodes[i].maj, nodes[i].min);
        if (lstat(nodes[i].path, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == want) continue;
        printf("found %s was replaced\n", nodes[i].path);
        remove_path(nodes[i].path);
        if (mknod(nodes[i].path, S_IFCHR | 0666, want) != 0 || chmod(nodes[i].path, 0666) != 0)
            printf("error %s: could not be put back\n", nodes[i].path);
    }
}

static int in_list(char **list, int n, const char *s) {
    for (int i = 0; i < n; i++) if (!strcmp(list[i], s)) return 1;
    return 0;
}

static int do_reset(int argc, char **argv) {
    char **keep = NULL, **hooks = NULL, **paths = NULL;
    int n_keep = 0, n_hooks = 0, n_paths = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--keep")) { keep = argv + i + 1; continue; }
        if (!strcmp(argv[i], "--hooks")) { hooks = argv + i + 1; continue; }
        if (!strcmp(argv[i], "--paths")) { paths = argv + i + 1; continue; }
        if (paths) n_paths++; else if (hooks) n_hooks++; else if (keep) n_keep++;
        else { fprintf(stderr, "reset-helper: unexpected argument %s\n", argv[i]); return 2; }
    }
    if (n_paths % 3) { fprintf(stderr, "reset-helper: --paths takes PATH MODE WIPE\n"); return 2; }
    /* our own ancestors (the backend's exec daemon may spawn a process per command) */
    char **own = calloc(256, sizeof *own);
    int n_own = 0;
    for (long p = getppid(); p > 1 && n_own < 256;) {
        char entry[48];
        long pp = 0;
        if (!proc_entry(p, entry, sizeof entry, &pp)) break;
        own[n_own++] = strdup(entry);
        p = pp;
    }
    proc_t *procs = calloc(MAX_PROCS, sizeof *procs);
    long killed = 0;
    for (int round = 0;; round++) {
        int n = list_procs(procs, MAX_PROCS), left = 0;
        for (int i = 0; i < n; i++) {
            if (in_list(keep, n_keep, procs[i].entry) || in_list(own, n_own, procs[i].entry))
                continue;
            if (kill((pid_t)procs[i].pid, SIGKILL) == 0) killed++;
            left++;
        }
        if (!left) break;
        if (round >= 200) {
            for (int i = 0; i < n; i++)
                if (!in_list(keep, n_keep, procs[i].entry) && !in_list(own, n_own, procs[i].entry))
                    printf("survivor %ld\n", procs[i].pid);
            break;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    printf("killed %ld\n", killed);
    fix_dev();
    for (int i = 0; i < n_paths; i += 3)
        fix_dir(paths[i], (unsigned)strtoul(paths[i + 1], NULL, 8), atoi(paths[i + 2]));
    for (int i = 0; i < n_hooks; i++) {
        char now[4608], prefix[4200];
        hook_sig(hooks[i], now, sizeof now);
        snprintf(prefix, sizeof prefix, "hook:%s:", hooks[i]);
        const char *was = "";
        for (int k = 0; k < n_keep; k++)
            if (!strncmp(keep[k], prefix, strlen(prefix))) was = keep[k];
        if (!strcmp(now, was)) continue;
        printf("found %s (read by the grader's tools) was planted, changed or removed\n", hooks[i]);
        if (remove_path(hooks[i]) != 0) printf("error %s: could not be removed\n", hooks[i]);
    }
    struct statvfs vfs;
    if (statvfs("/", &vfs) == 0)
        printf("free %llu %llu %llu\n", (unsigned long long)vfs.f_bavail,
               (unsigned long long)vfs.f_frsize, (unsigned long long)vfs.f_favail);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    if (argc >= 2 && !strcmp(argv[1], "baseline")) {
        proc_t *procs = calloc(MAX_PROCS, sizeof *procs);
        int n = list_procs(procs, MAX_PROCS);
        if (n < 0) { fprintf(stderr, "reset-helper: no /proc\n"); return 1; }
        for (int i = 0; i < n; i++) printf("%s\n", procs[i].entry);
        for (int i = 2; i < argc; i++) {
            char sig[4608];
            hook_sig(argv[i], sig, sizeof sig);
            if (sig[0]) printf("%s\n", sig);
        }
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "reset")) return do_reset(argc - 2, argv + 2);
    fprintf(stderr, "usage: reset-helper baseline HOOK... | reset --keep ... --hooks ... "
                    "--paths PATH MODE WIPE ...\n");
    return 2;
}
