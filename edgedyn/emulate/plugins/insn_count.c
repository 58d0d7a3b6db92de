/*
 * edgedyn's instruction counter: a qemu-user TCG plugin that counts the guest instructions a process executes
 * and writes the total to the file named by its `out=` argument (the guest's own stdout stays untouched).
 * A guest may also mark points of its run: the total at each mark is written too (see MARK_SYSCALL).
 *
 *   qemu-aarch64 -L ROOT -cpu cortex-a76 -plugin insn_count.so,out=/tmp/count.json ROOT/usr/bin/python3 ...
 *
 * Written for the plugin API of QEMU 7.2 (Debian bookworm's qemu-user), version 1, which no Debian package ships a
 * header for: the few declarations it needs are below, with the layouts of that version.
 *
 * Deterministic with several guest threads: in qemu-user each guest thread is a vCPU running in its own host
 * thread, and translated blocks are shared between them, so one shared counter bumped by inline adds would lose
 * counts when two threads race. Each executed block instead calls back with its vCPU's index and adds its length
 * to that vCPU's own counter (only that vCPU's host thread writes it); the counters are summed at exit.
 *
 * Built by edgedyn.emulate.instructions with the host's gcc: gcc -shared -fPIC -O2 -o insn_count.so insn_count.c
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EDGEDYN_PLUGIN_VERSION "edgedyn-insn-count 2"
#define EXPORT __attribute__((visibility("default")))

/* ---- The QEMU 7.2 plugin API (include/qemu/qemu-plugin.h, QEMU_PLUGIN_VERSION 1), the parts used here. ---- */
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;

typedef struct {
    const char *target_name;
    struct {
        int min;
        int cur;
    } version;
    bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;

enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };

typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_syscall_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num, uint64_t a1,
                                              uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6,
                                              uint64_t a7, uint64_t a8);

extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
extern void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                                 enum qemu_plugin_cb_flags flags, void *userdata);
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
extern void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_syscall_cb_t cb);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
extern void qemu_plugin_outs(const char *string);

/* QEMU refuses a plugin whose version it does not know; 1 is the version QEMU 7.2 implements. */
EXPORT int qemu_plugin_version = 1;

/* ---- The counter. ---- */

/* One counter per vCPU, each on its own cache line so threads do not slow each other down. QEMU numbers a new
 * thread one above the highest live index; a process whose indices reach SLOTS shares one atomic counter for the
 * rest (still exact, only slower). */
#define SLOTS 1024
struct slot {
    uint64_t insns;
    char pad[64 - sizeof(uint64_t)];
};
static struct slot counts[SLOTS];
static uint64_t overflow;      /* atomic: vCPUs with index >= SLOTS */
static unsigned int vcpus_seen; /* atomic max: 1 + the highest vCPU index that executed code */
static char out_path[4096];

/* A mark: the guest calls syscall(MARK_SYSCALL, MARK_MAGIC), a number Linux has no syscall for (qemu answers
 * -ENOSYS and does nothing else), and the total of every vCPU at that point is kept. In Python:
 * ctypes.CDLL(None).syscall(0x6564, ctypes.c_long(0x6564796e)). */
#define MARK_SYSCALL 0x6564
#define MARK_MAGIC 0x6564796e
#define MAX_MARKS 4096
static uint64_t marks[MAX_MARKS];
static unsigned int n_marks; /* atomic */
static pid_t owner;            /* the process that loaded the plugin; a forked child inherits it but writes nothing */

static void note_vcpu(unsigned int vcpu_index)
{
    unsigned int seen = __atomic_load_n(&vcpus_seen, __ATOMIC_RELAXED);
    while (vcpu_index + 1 > seen &&
           !__atomic_compare_exchange_n(&vcpus_seen, &seen, vcpu_index + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void on_block(unsigned int vcpu_index, void *length)
{
    uint64_t n = (uint64_t)(uintptr_t)length;
    if (vcpu_index < SLOTS) {
        if (counts[vcpu_index].insns == 0) {
            note_vcpu(vcpu_index);
        }
        counts[vcpu_index].insns += n; /* only this vCPU's host thread writes its slot */
    } else {
        note_vcpu(vcpu_index);
        __atomic_fetch_add(&overflow, n, __ATOMIC_RELAXED);
    }
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_cb(tb, on_block, QEMU_PLUGIN_CB_NO_REGS, (void *)(uintptr_t)n);
}

static uint64_t total_now(void)
{
    uint64_t total = __atomic_load_n(&overflow, __ATOMIC_RELAXED);
    for (unsigned int i = 0; i < SLOTS; i++) {
        total += __atomic_load_n(&counts[i].insns, __ATOMIC_RELAXED);
    }
    return total;
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num, uint64_t a1, uint64_t a2,
                       uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    (void)id, (void)vcpu_index, (void)a2, (void)a3, (void)a4, (void)a5, (void)a6, (void)a7, (void)a8;
    if (num != MARK_SYSCALL || a1 != MARK_MAGIC) {
        return;
    }
    unsigned int index = __atomic_fetch_add(&n_marks, 1, __ATOMIC_RELAXED);
    if (index < MAX_MARKS) {
        marks[index] = total_now();
    }
}

static void write_total(qemu_plugin_id_t id, void *unused)
{
    (void)id;
    (void)unused;
    if (getpid() != owner) {
        return; /* a forked child: its counters began as a copy of its parent's, so its total means nothing */
    }
    uint64_t total = total_now();
    /* Written beside the target and renamed into place, so a reader never sees half a file. */
    char partial[sizeof(out_path) + 16];
    snprintf(partial, sizeof(partial), "%s.partial", out_path);
    FILE *file = fopen(partial, "w");
    if (file == NULL) {
        qemu_plugin_outs("insn_count: cannot write the count file\n");
        return;
    }
    unsigned int vcpus = __atomic_load_n(&vcpus_seen, __ATOMIC_RELAXED);
    fprintf(file, "{\"instructions\": %llu, \"vcpus\": %u, \"plugin\": \"%s\", \"per_vcpu\": [",
            (unsigned long long)total, vcpus, EDGEDYN_PLUGIN_VERSION);
    for (unsigned int i = 0; i < vcpus && i < SLOTS; i++) {
        fprintf(file, "%s%llu", i ? ", " : "", (unsigned long long)__atomic_load_n(&counts[i].insns, __ATOMIC_RELAXED));
    }
    unsigned int marked = __atomic_load_n(&n_marks, __ATOMIC_RELAXED);
    fprintf(file, "], \"marks\": [");
    for (unsigned int i = 0; i < marked && i < MAX_MARKS; i++) {
        fprintf(file, "%s%llu", i ? ", " : "", (unsigned long long)marks[i]);
    }
    fprintf(file, "], \"marks_dropped\": %u}\n", marked > MAX_MARKS ? marked - MAX_MARKS : 0);
    if (fclose(file) != 0 || rename(partial, out_path) != 0) {
        qemu_plugin_outs("insn_count: cannot write the count file\n");
    }
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    if (info->system_emulation) {
        qemu_plugin_outs("insn_count: counts a user-mode process (qemu-aarch64), not a system emulator\n");
        return -1;
    }
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0 && strlen(argv[i] + 4) < sizeof(out_path)) {
            strcpy(out_path, argv[i] + 4);
        } else {
            qemu_plugin_outs("insn_count: unknown or too long argument (expected out=FILE)\n");
            return -1;
        }
    }
    if (out_path[0] == '\0') {
        qemu_plugin_outs("insn_count: no out=FILE argument\n");
        return -1;
    }
    owner = getpid();
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, write_total, NULL);
    return 0;
}
