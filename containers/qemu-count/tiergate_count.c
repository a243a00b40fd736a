/*
 * tiergate's instruction counter: a QEMU TCG plugin (linux-user, QEMU 10 plugin API v4).
 *
 * Counts the guest instructions executed (an inline add per translated block, of its instruction count) and the
 * guest memory reads (an inline add per read access), per vCPU, and writes the running totals each time the
 * guest makes the marker syscall (number TIERGATE_MARK_NR, which no Linux architecture has: the kernel, or
 * QEMU, answers ENOSYS and nothing else happens). Its first argument is the harness's code for the point
 * (load start/end, call start/end). Each marker appends "code instructions reads all_instructions all_reads\n" to
 * PREFIX.PID, where PREFIX is the plugin's `out=` argument and PID the guest process's (a forked child writes its
 * own file): the first two of the thread (vCPU) that made the marker, the last two of every thread of the process.
 * Another thread's work between two markers depends on timing (a thread that wakes on a timer runs more often
 * while a call is slow), so a single-threaded runtime is counted on its own thread alone.
 *
 * The counts are exact and independent of the host's speed or load: TCG executes the same guest instructions for
 * the same program and inputs. A block is counted when it starts, whole; a syscall ends a block, so at a marker
 * every counted block has run to its end.
 *
 *   qemu-aarch64 -plugin libtiergate_count.so,out=/tmp/tiergate-insn PROGRAM ...
 */
#include <fcntl.h>
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define TIERGATE_MARK_NR 0x7467     /* "tg": above every Linux syscall number on aarch64 and x86_64 */

typedef struct {
    uint64_t insns;
    uint64_t reads;
    uint64_t pad[6];    /* a cache line per vCPU: threads adding to neighbouring counts would share one (and slow
                         * every translated block's inline add when several threads run at once) */
} Counts;

static struct qemu_plugin_scoreboard *counts;
static qemu_plugin_u64 insns, reads;
static char out_prefix[512] = "/tmp/tiergate-insn";
static int count_reads = 1;

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, insns, n);
    if (!count_reads) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        qemu_plugin_register_vcpu_mem_inline_per_vcpu(insn, QEMU_PLUGIN_MEM_R, QEMU_PLUGIN_INLINE_ADD_U64,
                                                      reads, 1);
    }
}

static void syscall_cb(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1, uint64_t a2,
                       uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    if (num != TIERGATE_MARK_NR) {
        return;
    }
    char path[600], line[96];
    snprintf(path, sizeof path, "%s.%ld", out_prefix, (long)getpid());
    int len = snprintf(line, sizeof line, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", a1,
                       qemu_plugin_u64_get(insns, vcpu), qemu_plugin_u64_get(reads, vcpu),
                       qemu_plugin_u64_sum(insns), qemu_plugin_u64_sum(reads));
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, line, len) != len) {
            fprintf(stderr, "tiergate_count: short write to %s\n", path);
        }
        close(fd);
    }
}

static void plugin_exit(qemu_plugin_id_t id, void *p)
{
    qemu_plugin_scoreboard_free(counts);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (g_str_has_prefix(argv[i], "out=")) {
            g_strlcpy(out_prefix, argv[i] + 4, sizeof out_prefix);
        } else if (g_str_has_prefix(argv[i], "reads=")) {
            count_reads = strcmp(argv[i] + 6, "off") != 0;
        } else {
            fprintf(stderr, "tiergate_count: unknown argument %s (out=PREFIX, reads=on|off)\n", argv[i]);
            return -1;
        }
    }
    counts = qemu_plugin_scoreboard_new(sizeof(Counts));
    insns = qemu_plugin_scoreboard_u64_in_struct(counts, Counts, insns);
    reads = qemu_plugin_scoreboard_u64_in_struct(counts, Counts, reads);
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_vcpu_syscall_cb(id, syscall_cb);
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
    return 0;
}
